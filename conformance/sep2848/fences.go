package sep2848

// The fences: cancellation, retry, and the expiry of requests and of
// approvals. Where they can, these scenarios let an approval reach the
// server first, so that only the server's own fence stands between the
// approval and a run.

import (
	"context"
	"fmt"
	"sync"
	"time"
)

func cancel(ctx context.Context, r *run) error {
	before, have, err := r.probe(ctx)
	if err != nil {
		return err
	}
	// A pending task, cancelled.
	call := r.p.Gated.Fresh()
	t, err := r.create(ctx, r.c, call)
	if err != nil {
		return err
	}
	resp, err := r.c.call(ctx, MethodCancel, t.TaskID, map[string]any{"taskId": t.TaskID})
	if err != nil {
		return err
	}
	g, err := r.get(ctx, r.c, t.TaskID)
	if err != nil {
		return err
	}
	r.expect("sep-2848-cancel-wins-before-claim", resp.err == nil && g.Status == StatusCancelled,
		"after tasks/cancel (error %v) the task is %s", resp.err, g.Status)

	// An approval that has reached the server, and cannot be used yet (its
	// grant is provisioning), then the cancel: the backend cannot take the
	// approval back, so only the server's own fence stands between it and
	// a run.
	var fenced string
	if r.p.Provisioning == nil {
		r.skip("sep-2848-cancelled-never-executes", "the profile has no provisioning call, so no approval can reach the server ahead of a cancel")
	} else {
		pcall := r.p.Provisioning.Fresh()
		pt, err := r.create(ctx, r.c, pcall)
		if err != nil {
			return err
		}
		fenced = pt.TaskID
		if err := r.cfg.Resolver.Resolve(ctx, pt.TaskID, pcall, true, "approved by the conformance run, then cancelled"); err != nil {
			return err
		}
		resp, err := r.c.call(ctx, MethodCancel, pt.TaskID, map[string]any{"taskId": pt.TaskID})
		if err != nil {
			return err
		}
		// Watch past the moment the grant provisions (the whole window, so
		// a run it lets through is seen here, not by a later check), and
		// long enough after it for a server under load to have run it.
		var ran, reopened string
		deadline := time.Now().Add(time.Duration(r.p.Provisioning.After) + 3*r.settle())
		for time.Now().Before(deadline) && ran == "" {
			g, err := r.get(ctx, r.c, pt.TaskID)
			if err != nil {
				return err
			}
			if (g.Status != StatusCancelled || len(g.Result) > 0) && reopened == "" {
				reopened = fmt.Sprintf("the task is %s (result %.100s)", g.Status, g.Result)
			}
			if have {
				after, _, err := r.probe(ctx)
				if err != nil {
					return err
				}
				if after != before {
					ran = fmt.Sprintf("the tool ran: %s went from %v to %v", r.p.Probe.Field, before, after)
				}
			}
			if err := sleep(ctx, 200*time.Millisecond); err != nil {
				return err
			}
		}
		switch {
		case resp.err != nil:
			r.fail("sep-2848-cancelled-never-executes", "tasks/cancel after the approval, before its grant could be used, was refused: %v", resp.err)
		case ran != "":
			r.fail("sep-2848-cancelled-never-executes", "approved, then cancelled before the grant provisioned: %s", ran)
		case reopened != "":
			r.fail("sep-2848-cancelled-never-executes", "approved, then cancelled before the grant provisioned: %s", reopened)
		case !have:
			r.skip("sep-2848-cancelled-never-executes", "the task stayed cancelled, but the profile has no probe to show the tool did not run")
		default:
			r.pass("sep-2848-cancelled-never-executes")
		}
	}
	if err := lateApproval(ctx, r, t.TaskID, call); err != nil {
		return err
	}
	for _, id := range []string{t.TaskID, fenced} {
		if id == "" {
			continue
		}
		g, err := r.get(ctx, r.c, id)
		if err != nil {
			return err
		}
		_, envelope := envelopeOf(g.Meta)
		if g.Status != StatusCancelled || len(g.Result) > 0 || g.Meta[MetaDisposition] != nil || envelope {
			r.fail("sep-2848-cancelled-no-disposition", "cancelled task %s: status %s, result %s, _meta %v", id, g.Status, g.Result, g.Meta)
		}
	}
	r.pass("sep-2848-cancelled-no-disposition") // the first failure stands

	if err := cancelRace(ctx, r); err != nil {
		return err
	}
	if err := backendCancel(ctx, r); err != nil {
		return err
	}

	// notifications/cancelled names a request, and must not cancel a task.
	t2, err := r.create(ctx, r.c, r.p.Gated.Fresh())
	if err != nil {
		return err
	}
	defer r.drop(context.WithoutCancel(ctx), r.c, t2.TaskID)
	for _, rid := range []any{r.c.id.Load(), t2.TaskID} {
		if err := r.c.notify(ctx, "notifications/cancelled", map[string]any{"requestId": rid, "reason": "conformance"}); err != nil {
			return err
		}
	}
	if err := sleep(ctx, r.settle()/2); err != nil {
		return err
	}
	g2, err := r.get(ctx, r.c, t2.TaskID)
	if err != nil {
		return err
	}
	r.expect("sep-2848-notification-does-not-cancel", g2.Status == StatusWorking, "after notifications/cancelled the task is %s", g2.Status)
	return nil
}

// lateApproval follows the task id, cancelled while its call waited for a
// decision: where the resolver can read the backend's request, the
// winning cancel must have cancelled it there; then an approval is given
// after the cancel (the backend may refuse it), and must run nothing and
// leave the task cancelled.
func lateApproval(ctx context.Context, r *run, id string, call Call) error {
	const check = "sep-2848-cancelled-never-executes"
	if rr, ok := r.cfg.Resolver.(RequestReader); ok {
		wctx, stop := context.WithTimeout(ctx, r.cfg.Timeout)
		defer stop()
		status := ""
		for status != "cancelled" {
			var err error
			if status, err = rr.RequestStatus(wctx, id, call); err != nil {
				status = err.Error()
			}
			if status == "cancelled" || sleep(wctx, 200*time.Millisecond) != nil {
				break
			}
		}
		if status != "cancelled" {
			r.fail(check, "after a winning tasks/cancel the backend's request is still %s, not cancelled", status)
		}
	}
	before, have, err := r.probe(ctx)
	if err != nil {
		return err
	}
	answer := "accepted by the backend"
	if err := r.cfg.Resolver.Resolve(ctx, id, call, true, "approved after the task was cancelled"); err != nil {
		answer = "refused by the backend: " + err.Error()
	} else if err := sleep(ctx, 3*r.settle()); err != nil {
		// Accepted, it may reach the server: three watches, as for the
		// approval before a cancel, so a server under load acting on it is
		// still seen acting. Refused, it reaches nothing: no wait.
		return err
	}
	g, err := r.get(ctx, r.c, id)
	if err != nil {
		return err
	}
	if g.Status != StatusCancelled || len(g.Result) > 0 {
		r.fail(check, "an approval given after the cancel (%s) moved the task to %s (result %.100s)", answer, g.Status, g.Result)
	}
	if have {
		after, _, err := r.probe(ctx)
		if err != nil {
			return err
		}
		if after != before {
			r.fail(check, "an approval given after the cancel (%s) ran the tool: %s went from %v to %v", answer, r.p.Probe.Field, before, after)
		}
	}
	return nil
}

// cancelRace sends an approval and a cancel together, a few times: each
// task ends either cancelled with no effect or completed approved-executed
// with exactly one, and the effects add up.
func cancelRace(ctx context.Context, r *run) error {
	const id, rounds = "sep-2848-cancel-race-one-outcome", 3
	before, have, err := r.probe(ctx)
	if err != nil {
		return err
	}
	if !have {
		r.skip(id, "the profile has no probe")
		return nil
	}
	completed := 0
	for range rounds {
		call := r.p.Gated.Fresh()
		t, err := r.create(ctx, r.c, call)
		if err != nil {
			return err
		}
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			_ = r.cfg.Resolver.Resolve(ctx, t.TaskID, call, true, "approved while being cancelled") // may lose to the cancel
		}()
		go func() {
			defer wg.Done()
			_, _ = r.c.call(ctx, MethodCancel, t.TaskID, map[string]any{"taskId": t.TaskID})
		}()
		wg.Wait()
		done, err := r.c.wait(ctx, t.TaskID, nil)
		if err != nil {
			return err
		}
		switch done.Status {
		case StatusCancelled:
			if len(done.Result) > 0 {
				r.fail(id, "task %s is cancelled with a result", t.TaskID)
			}
		case StatusCompleted:
			res, err := done.toolResult()
			if err != nil || disposition(res) != ApprovedExecuted {
				r.fail(id, "task %s completed without approved-executed: %v", t.TaskID, describe(res, err))
			}
			completed++
		default:
			r.fail(id, "task %s ended %s", t.TaskID, done.Status)
		}
	}
	if err := sleep(ctx, r.settle()); err != nil {
		return err
	}
	after, _, err := r.probe(ctx)
	if err != nil {
		return err
	}
	n := r.executions(before, after)
	r.expect(id, n == float64(completed), "%d of %d raced tasks completed, and the tool ran %v times", completed, rounds, n)
	return nil
}

// backendCancel cancels a pending request at the backend: the task ends
// cancelled, with no result and no disposition, and nothing runs.
func backendCancel(ctx context.Context, r *run) error {
	const id = "sep-2848-backend-cancel-cancelled"
	c, ok := r.cfg.Resolver.(Canceller)
	if !ok {
		r.skip(id, "the resolver cannot cancel a request at the backend")
		return nil
	}
	before, have, err := r.probe(ctx)
	if err != nil {
		return err
	}
	call := r.p.Gated.Fresh()
	t, err := r.create(ctx, r.c, call)
	if err != nil {
		return err
	}
	defer r.drop(context.WithoutCancel(ctx), r.c, t.TaskID)
	if err := c.CancelRequest(ctx, t.TaskID, call); err != nil {
		r.fail(id, "cancelling the request at the backend: %v", err)
		return nil
	}
	wctx, stop := context.WithTimeout(ctx, r.cfg.Timeout)
	defer stop()
	done, err := r.c.wait(wctx, t.TaskID, nil)
	if err != nil {
		r.fail(id, "the task did not end after its request was cancelled at the backend: %v", err)
		return nil
	}
	if _, envelope := envelopeOf(done.Meta); done.Status != StatusCancelled || len(done.Result) > 0 || done.Meta[MetaDisposition] != nil || envelope {
		r.fail(id, "after a backend cancel the task is %s (result %.100s)", done.Status, done.Result)
		return nil
	}
	return r.notRun(ctx, id, before, have)
}

func describe(res *toolResult, err error) string {
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("isError %v, disposition %q, body %q", res.IsError, disposition(res), res.text())
}

// retry: an approval whose grant provisions a while later. Re-evaluation
// answers retry meanwhile: the task stays working, never becomes a denial,
// and then runs once.
func retry(ctx context.Context, r *run) error {
	const id = "sep-2848-retry-not-denial"
	if r.p.Provisioning == nil {
		r.skipScenario("the profile has no provisioning call")
		return nil
	}
	before, have, err := r.probe(ctx)
	if err != nil {
		return err
	}
	call := r.p.Provisioning.Fresh()
	t, err := r.create(ctx, r.c, call)
	if err != nil {
		return err
	}
	if err := r.cfg.Resolver.Resolve(ctx, t.TaskID, call, true, "approved by the conformance run"); err != nil {
		return err
	}
	// Every read while the grant provisions is the retry row of the
	// lifecycle: working, the envelope still available, no result yet.
	odd, waiting, aware := "", 0, r.sep2643(t)
	wctx, stop := context.WithTimeout(ctx, time.Duration(r.p.Provisioning.After)+r.cfg.Timeout)
	defer stop()
	done, err := r.c.watch(wctx, t.TaskID, nil, func(g *task) {
		if terminal(g) || odd != "" {
			return
		}
		waiting++
		switch msg := envelopeIs(g.Meta, RemediationAvailable, false); {
		case g.Status != StatusWorking:
			odd = string(g.Status) + ", not working"
		case len(g.Result) > 0:
			odd = fmt.Sprintf("working with a result (%.100s)", g.Result)
		case aware && msg != "":
			odd = "working, but " + msg
		}
	})
	if err != nil {
		return err
	}
	res, rerr := done.toolResult()
	switch {
	case rerr != nil || done.Status != StatusCompleted:
		r.fail(id, "the task ended %s while its grant provisioned: %v", done.Status, rerr)
	case disposition(res) != ApprovedExecuted:
		r.fail(id, "a retryable outcome ended the task %s: %q", disposition(res), res.text())
	case odd != "":
		r.fail(id, "while retrying the task read %s", odd)
	case waiting == 0:
		r.fail(id, "the task was never read between the approval and its end, so its state while retrying is unknown")
	case have:
		if err := sleep(ctx, r.settle()); err != nil {
			return err
		}
		after, _, err := r.probe(ctx)
		if err != nil {
			return err
		}
		n := r.executions(before, after)
		r.expect(id, n == 1, "after the retry the tool ran %v times", n)
	default:
		r.pass(id)
	}
	return nil
}

func expiry(ctx context.Context, r *run) error {
	const id = "sep-2848-expired-denied"
	if r.p.Expiring == nil {
		r.skipScenario("the profile has no expiring call")
		return nil
	}
	before, have, err := r.probe(ctx)
	if err != nil {
		return err
	}
	call := r.p.Expiring.Fresh()
	t, err := r.create(ctx, r.c, call)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, time.Duration(r.p.ExpiresWithin)+time.Minute)
	defer cancel()
	done, err := r.c.wait(wctx, t.TaskID, nil)
	if err != nil {
		return err
	}
	res, rerr := done.toolResult()
	envelope := ""
	if rerr == nil && r.sep2643(t) {
		envelope = envelopeIs(res.Meta, RemediationUnavailable, false)
	}
	r.expect(id, rerr == nil && done.Status == StatusCompleted && res.IsError &&
		disposition(res) == DeniedNotExecuted && saysNotRan.MatchString(res.text()) && saysExpired.MatchString(res.text()) && envelope == "",
		"expired task: status %s, %v %s", done.Status, describe(res, rerr), envelope)
	return expiredFenced(ctx, r, done, call, before, have)
}

// expiredFenced: the expired task ran nothing, and an approval given after
// the expiry (which the backend may refuse) changes nothing and runs
// nothing.
func expiredFenced(ctx context.Context, r *run, done *task, call Call, before float64, have bool) error {
	const id = "sep-2848-expired-fenced"
	if !terminal(done) {
		r.fail(id, "the expired task is %s, not ended", done.Status)
		return nil
	}
	answer := "accepted by the backend"
	if err := r.cfg.Resolver.Resolve(ctx, done.TaskID, call, true, "approved after the request expired"); err != nil {
		answer = "refused by the backend: " + err.Error()
	} else if err := sleep(ctx, 3*r.settle()); err != nil {
		// Accepted: three watches, as for an approval after a cancel.
		return err
	}
	g, err := r.get(ctx, r.c, done.TaskID)
	if err != nil {
		return err
	}
	if g.Status != done.Status || string(g.Result) != string(done.Result) {
		r.fail(id, "an approval given after the expiry (%s) changed the task from %s to %s (result %.200s)", answer, done.Status, g.Status, g.Result)
		return nil
	}
	if !have {
		r.skip(id, "the task did not change, but the profile has no probe to show the tool did not run")
		return nil
	}
	after, _, err := r.probe(ctx)
	if err != nil {
		return err
	}
	r.expect(id, after == before, "the tool ran after the request expired (a late approval %s): %s went from %v to %v", answer, r.p.Probe.Field, before, after)
	return nil
}

// approvalExpiry: an approval that expires before its grant provisions.
// The backend still reports the request granted, so only the server stands
// between that stale approval and a run. The server must stop retrying on
// it; each new request it opens is approved too (and outlived too), until
// the server's bound on requests ends the task denied.
func approvalExpiry(ctx context.Context, r *run) error {
	if r.p.Outliving == nil {
		r.skipScenario("the profile has no outliving call")
		return nil
	}
	before, have, err := r.probe(ctx)
	if err != nil {
		return err
	}
	call := r.p.Outliving.Fresh()
	t, err := r.open(ctx, r.c, call)
	if err != nil {
		return err
	}
	defer r.drop(context.WithoutCancel(ctx), r.c, t.TaskID)
	if err := r.cfg.Resolver.Resolve(ctx, t.TaskID, call, true, "approved by the conformance run"); err != nil {
		return err
	}
	// Poll the task, and offer the resolver a new approval each time: it
	// can give one only once the server has opened a new request.
	first := time.Now()
	approvedAt, approvals, left, stalled := first, 1, time.Duration(-1), ""
	// The grant's own delay, two watches, and half a minute for a busy
	// server: a server that waits the retry hint out (or less) and then
	// stops is within it, one that keeps retrying on the expired approval
	// never is. A liveness bound: the loop moves on as soon as the server
	// does, so its width costs a passing run nothing, while a narrow one
	// failed a correct server on a loaded machine.
	bound := time.Duration(r.p.Outliving.After) + 2*r.settle() + 30*time.Second
	var done *task
	chained, aware := "", r.sep2643(t)
	for {
		g, err := r.get(ctx, r.c, t.TaskID)
		if err != nil {
			return err
		}
		if terminal(g) {
			done = g
			break
		}
		// While the server chains requests on the expired approvals, the
		// task is the request row of the lifecycle: waiting (working, or
		// input_required should a new request need input), the envelope
		// still available, no result yet.
		switch msg := envelopeIs(g.Meta, RemediationAvailable, false); {
		case chained != "":
		case len(g.Result) > 0:
			chained = fmt.Sprintf("the waiting task read %s with a result (%.100s)", g.Status, g.Result)
		case aware && msg != "":
			chained = fmt.Sprintf("the waiting task read %s, but %s", g.Status, msg)
		case g.Status != StatusWorking && g.Status != StatusInputRequired:
			chained = fmt.Sprintf("the waiting task read %s, not working", g.Status)
		}
		if g.Status == StatusInputRequired {
			if _, err := r.c.call(ctx, MethodUpdate, t.TaskID, map[string]any{"taskId": t.TaskID, "inputResponses": r.answers(g.InputRequests)}); err != nil {
				return err
			}
		} else if r.cfg.Resolver.Resolve(ctx, t.TaskID, call, true, "approved again by the conformance run") == nil {
			approvals++
			approvedAt = time.Now()
		}
		if left < 0 && approvals > 1 {
			left = time.Since(first)
		}
		if approvals > r.p.MaxRequests {
			break
		}
		if time.Since(approvedAt) > bound {
			stalled = fmt.Sprintf("the task still waits (%s) %s after approval %d, whose approval expired before its grant would provision (after %s)",
				g.Status, time.Since(approvedAt).Round(time.Millisecond), approvals, time.Duration(r.p.Outliving.After))
			break
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
	if left < 0 && done != nil {
		left = time.Since(first)
	}
	if have {
		if err := sleep(ctx, r.settle()); err != nil {
			return err
		}
	}
	after, _, err := r.probe(ctx)
	if err != nil {
		return err
	}
	var res *toolResult
	if done != nil && done.Status == StatusCompleted {
		res, _ = done.toolResult()
	}
	ranAsApproved := res != nil && disposition(res) == ApprovedExecuted
	switch {
	case have && after != before:
		r.fail("sep-2848-expired-never-executes", "the tool ran on an expired approval: %s went from %v to %v", r.p.Probe.Field, before, after)
	case ranAsApproved:
		r.fail("sep-2848-expired-never-executes", "the task completed approved-executed on an approval that had expired")
	case !have:
		r.skip("sep-2848-expired-never-executes", "the profile has no probe")
	default:
		r.pass("sep-2848-expired-never-executes")
	}
	// The loop gives up on a cycle after the bound: having left the
	// first approval at all means it left in time.
	r.expect("sep-2848-retry-stops-at-expiry", left >= 0, "%s", stalled)
	switch {
	case done == nil && stalled != "":
		r.fail("sep-2848-chain-bounded", "%s", stalled)
	case done == nil:
		r.fail("sep-2848-chain-bounded", "%d approvals, more than the bound of %d requests, and the task still waits", approvals, r.p.MaxRequests)
	case res == nil || disposition(res) != DeniedNotExecuted || !res.IsError:
		r.fail("sep-2848-chain-bounded", "after %d approvals the task ended %s (%s), not denied-not-executed", approvals, done.Status, describeMaybe(res))
	case chained != "":
		r.fail("sep-2848-chain-bounded", "while new requests were made for it, %s", chained)
	case r.p.MaxRequests > 1 && approvals < 2:
		r.fail("sep-2848-chain-bounded", "the task ended after its first approval expired, but the profile says the server makes up to %d requests per task", r.p.MaxRequests)
	case aware && envelopeIs(res.Meta, RemediationUnavailable, false) != "":
		r.fail("sep-2848-chain-bounded", "the denial that ends the chain: %s", envelopeIs(res.Meta, RemediationUnavailable, false))
	case !saysNotRan.MatchString(res.text()) || !saysExpired.MatchString(res.text()):
		// Its last approval expired unused: the approval validity passed
		// without a usable approval, and the body notes the expiry.
		r.fail("sep-2848-chain-bounded", "the denial that ends the chain, after its last approval expired unused, does not say the tool did not run and that the approval expired: %q", res.text())
	default:
		r.pass("sep-2848-chain-bounded")
	}
	return nil
}

func describeMaybe(res *toolResult) string {
	if res == nil {
		return "no result"
	}
	return describe(res, nil)
}
