package sep2848

// Who may see and steer a task, how often a caller may ask, how a client
// without tasks is answered, and what the whole run's responses may carry.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
)

func accessControl(ctx context.Context, r *run) error {
	if r.cfg.OtherToken == "" {
		r.skipScenario("no second principal (--other-token)")
		return nil
	}
	other := r.c.with(r.cfg.OtherToken, tasksOnly)
	t, err := r.create(ctx, r.c, r.p.Gated.Fresh())
	if err != nil {
		return err
	}
	defer r.drop(context.WithoutCancel(ctx), r.c, t.TaskID)
	g, err := other.call(ctx, MethodGet, t.TaskID, map[string]any{"taskId": t.TaskID})
	if err != nil {
		return err
	}
	r.expect("sep-2848-task-access-get", g.err != nil && (t.StatusMessage == "" || !strings.Contains(string(g.raw)+g.err.Message, t.StatusMessage)),
		"another principal read the task: %.300s", g.raw)
	// The same update from the owner first: if the server takes it from the
	// owner, a refusal to the other principal is about who asked.
	update := map[string]any{"taskId": t.TaskID, "inputResponses": map[string]any{}}
	own, err := r.c.call(ctx, MethodUpdate, t.TaskID, update)
	if err != nil {
		return err
	}
	u, err := other.call(ctx, MethodUpdate, t.TaskID, update)
	if err != nil {
		return err
	}
	c, err := other.call(ctx, MethodCancel, t.TaskID, map[string]any{"taskId": t.TaskID})
	if err != nil {
		return err
	}
	after, err := r.get(ctx, r.c, t.TaskID)
	if err != nil {
		return err
	}
	if own.err != nil {
		r.skip("sep-2848-task-access-update", fmt.Sprintf("inconclusive: the server refuses this tasks/update from the owner too (%s)", own.err.Message))
	} else {
		r.expect("sep-2848-task-access-update", u.err != nil && after.Status == StatusWorking, "another principal's tasks/update: error %v, task now %s", u.err, after.Status)
	}
	r.expect("sep-2848-task-access-cancel", c.err != nil && after.Status == StatusWorking, "another principal's tasks/cancel: error %v, task now %s", c.err, after.Status)
	ids := []string{t.TaskID}
	for range 3 {
		t2, err := r.create(ctx, r.c, r.p.Gated.Fresh())
		if err != nil {
			return err
		}
		defer r.drop(context.WithoutCancel(ctx), r.c, t2.TaskID)
		ids = append(ids, t2.TaskID)
	}
	r.expect("sep-2848-task-id-unguessable", guessable(ids) == "", "%s", guessable(ids))
	return nil
}

func dedup(ctx context.Context, r *run) error {
	call := r.p.Gated.Fresh()
	t1, err := r.create(ctx, r.c, call)
	if err != nil {
		return err
	}
	defer r.drop(context.WithoutCancel(ctx), r.c, t1.TaskID)
	t2, err := r.create(ctx, r.c, call)
	if err != nil {
		return err
	}
	if t2.TaskID != t1.TaskID {
		defer r.drop(context.WithoutCancel(ctx), r.c, t2.TaskID)
	}
	r.expect("sep-2848-dedup-same-task", t2.TaskID == t1.TaskID, "the repeated call opened task %s beside %s", t2.TaskID, t1.TaskID)

	call = r.p.Gated.Fresh()
	var mu sync.Mutex
	ids := map[string]bool{}
	var errs []error
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t, err := r.create(ctx, r.c, call)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			ids[t.TaskID] = true
		}()
	}
	wg.Wait()
	for id := range ids {
		defer r.drop(context.WithoutCancel(ctx), r.c, id)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	r.expect("sep-2848-dedup-concurrent", len(ids) == 1, "4 concurrent identical calls opened %d tasks", len(ids))
	return nil
}

func degraded(ctx context.Context, r *run) error {
	before, have, err := r.probe(ctx)
	if err != nil {
		return err
	}
	plain := r.c.with(r.cfg.Token, noExtensions)
	resp, err := plain.callTool(ctx, r.p.Gated.Fresh(), nil)
	if err != nil {
		return err
	}
	_, isTask := resp.result["taskId"]
	isErrorResult := resp.err == nil && resp.result["isError"] == true && !isTask
	var tr toolResult
	_ = json.Unmarshal(resp.raw, &tr)
	switch {
	case !isErrorResult && !namesTasks(resp.err):
		r.fail("sep-2848-degraded-without-tasks", "without the tasks extension the call answered %v %.300s", resp.err, resp.raw)
	case isErrorResult && requestableGuidance(tr.text()) != "":
		r.fail("sep-2848-degraded-without-tasks", "the degraded isError result carries no requestable guidance: %s: %q", requestableGuidance(tr.text()), tr.text())
	default:
		if err := r.notRun(ctx, "sep-2848-degraded-without-tasks", before, have); err != nil {
			return err
		}
	}
	switch {
	case !isErrorResult:
		r.fail("sep-2848-degraded-preferred", "the degraded answer is not an isError CallToolResult: %v %.300s", resp.err, resp.raw)
	case guidance(tr.text()) != "":
		r.fail("sep-2848-degraded-preferred", "the degraded result gives no next-step guidance: %s: %q", guidance(tr.text()), tr.text())
	default:
		r.pass("sep-2848-degraded-preferred")
	}
	if r.p.TaskRequired == nil {
		r.skip("sep-2848-task-required-error", "the profile has no task-only call")
		return nil
	}
	resp, err = plain.callTool(ctx, r.p.TaskRequired.Fresh(), nil)
	if err != nil {
		return err
	}
	r.expect("sep-2848-task-required-error", namesTasks(resp.err), "a task-only call without the tasks extension answered %v %.300s", resp.err, resp.raw)
	return nil
}

func plainDenial(ctx context.Context, r *run) error {
	const id = "sep-2848-plain-denial-no-task"
	if r.p.Denied == nil {
		r.skip(id, "the profile has no call with a denial that is not requestable")
		return nil
	}
	before, have, err := r.probe(ctx)
	if err != nil {
		return err
	}
	resp, err := r.c.callTool(ctx, r.p.Denied.Fresh(), nil)
	if err != nil {
		return err
	}
	if msg := notRequestable(resp); msg != "" {
		r.fail(id, "a plain denial answered %s: %.300s", msg, resp.raw)
		return nil
	}
	// The normal denied result describes the denial.
	var tr toolResult
	if err := json.Unmarshal(resp.raw, &tr); err != nil || strings.TrimSpace(tr.text()) == "" {
		r.fail(id, "the denied result has no text describing the denial: %.300s", resp.raw)
		return nil
	}
	return r.notRun(ctx, id, before, have)
}

// limits spends a principal of its own on the per-caller limits: first the
// bound on pending approval tasks (tasks left waiting), then the submission
// rate (each task cancelled at once, so nothing is pending when it trips).
// Each limit must answer with a denial that is not requestable.
func limits(ctx context.Context, r *run) error {
	switch {
	case r.p.Limits == nil:
		r.skipScenario("the profile gives no limits")
		return nil
	case r.cfg.LimitsToken == "":
		r.skipScenario("no principal to spend on the limits (--limits-token)")
		return nil
	}
	lim := *r.p.Limits
	lc := r.c.with(r.cfg.LimitsToken, tasksOnly)
	before, have, err := r.probeAs(ctx, lc)
	if err != nil {
		return err
	}
	var waiting []string
	cancelAll := func() {
		for _, id := range waiting {
			r.drop(context.WithoutCancel(ctx), lc, id)
		}
		waiting = nil
	}
	defer cancelAll()
	submitted := 0
	// submit makes one fresh gated call: its task, or the refusal.
	submit := func() (*task, *response, error) {
		resp, err := lc.callTool(ctx, r.p.Gated.Fresh(), nil)
		if err != nil {
			return nil, nil, err
		}
		if t, err := asTask(resp); err == nil && t.ResultType == ResultTask && t.TaskID != "" {
			submitted++
			return t, nil, nil
		}
		return nil, resp, nil
	}
	if lim.MaxPending+1 > lim.SubmissionsPerMinute {
		r.skip("sep-2848-pending-bounded", "the submission rate would trip before the pending bound")
	} else {
		var refusal *response
		for len(waiting) <= lim.MaxPending && refusal == nil {
			t, resp, err := submit()
			if err != nil {
				return err
			}
			if t != nil {
				waiting = append(waiting, t.TaskID)
			}
			refusal = resp
		}
		switch {
		case refusal == nil:
			r.fail("sep-2848-pending-bounded", "%d approval tasks wait, beyond the bound of %d, and the next call was not refused", len(waiting), lim.MaxPending)
		case notRequestable(refusal) != "":
			r.fail("sep-2848-pending-bounded", "with %d tasks waiting the call answered %s: %.300s", len(waiting), notRequestable(refusal), refusal.raw)
		default:
			r.pass("sep-2848-pending-bounded")
		}
	}
	cancelAll()
	var refusal *response
	for submitted <= lim.SubmissionsPerMinute && refusal == nil {
		t, resp, err := submit()
		if err != nil {
			return err
		}
		if t != nil {
			r.drop(ctx, lc, t.TaskID)
		}
		refusal = resp
	}
	switch {
	case refusal == nil:
		r.fail("sep-2848-submission-rate-limited", "%d approval requests within a minute, beyond the rate of %d, and the next call was not refused", submitted, lim.SubmissionsPerMinute)
	case notRequestable(refusal) != "":
		r.fail("sep-2848-submission-rate-limited", "over the rate, with nothing pending, the call answered %s: %.300s", notRequestable(refusal), refusal.raw)
	default:
		r.pass("sep-2848-submission-rate-limited")
	}
	if have {
		after, _, err := r.probeAs(ctx, lc)
		if err != nil {
			return err
		}
		if after != before {
			r.fail("sep-2848-submission-rate-limited", "the tool ran during the limits scenario: %s went from %v to %v", r.p.Probe.Field, before, after)
		}
	}
	return nil
}

// artifacts reads every response of the run: no backend artifacts (member
// names of binding material and endpoints, JWTs, the backend's URL), no
// authorizationContextId; in every completed result a body and an envelope
// that agree with its disposition, and a disposition on every completed
// task; and no model-facing text of any task that repeats its call's
// client-supplied text or carries control characters.
func artifacts(_ context.Context, r *run) error {
	bodies := r.c.seen.all()
	var msgs []any
	for _, b := range bodies {
		m := jsonMessages(b)
		if len(m) == 0 && len(bytes.TrimSpace(b)) > 0 {
			why := fmt.Sprintf("a response is neither JSON nor an event stream of JSON, so it cannot be scanned: %.200q", b)
			for _, id := range checksOf(r.scenario) {
				r.fail(id, "%s", why)
			}
			return nil
		}
		msgs = append(msgs, m...)
	}
	if len(bodies) == 0 {
		r.skipScenario("the run saw no responses to scan")
		return nil
	}
	// A SEP-2643 server is one seen emitting an envelope.
	aware := false
	for _, v := range msgs {
		aware = aware || findMember(v, "$", MetaAuthorization) != ""
	}
	artifact, contextID, disagree, missing, tainted, results, completed := "", "", "", "", "", 0, 0
	for _, v := range msgs {
		if w := findArtifact(v, "$", r.cfg.BackendURL); w != "" && artifact == "" {
			artifact = w
		}
		if w := findMember(v, "$", "authorizationContextId"); w != "" && contextID == "" {
			contextID = w
		}
		dispositions(v, func(d, text string, meta map[string]any) {
			results++
			msg := bodyAgrees(d, text)
			if msg == "" {
				msg = envelopeAgrees(d, meta, aware)
			}
			if msg != "" && disagree == "" {
				disagree = fmt.Sprintf("%s: %q", msg, text)
			}
		})
		completedResults(v, func(taskID string, result map[string]any) {
			completed++
			if msg := missingDisposition(taskID, result); msg != "" && missing == "" {
				missing = msg
			}
		})
		modelTexts(v, func(taskID string, texts []string) {
			call, _ := r.callOf(taskID) // unknown: control characters only
			if msg := untrusted(texts, call); msg != "" && tainted == "" {
				tainted = fmt.Sprintf("task %s: %s", taskID, msg)
			}
		})
	}
	r.expect("sep-2848-no-backend-artifacts", artifact == "", "%s", artifact)
	r.expect("sep-2848-no-authorization-context-id", contextID == "", "%s", contextID)
	r.expect("sep-2848-model-text-sanitized-run", tainted == "", "%s", tainted)
	if results == 0 {
		r.skip("sep-2848-body-disposition-agree", "the run saw no completed approval result")
	} else {
		r.expect("sep-2848-body-disposition-agree", disagree == "", "%s", disagree)
	}
	if completed == 0 {
		r.skip("sep-2848-disposition-on-every-completed", "the run saw no completed approval task")
	} else {
		r.expect("sep-2848-disposition-on-every-completed", missing == "", "%s", missing)
	}
	return nil
}
