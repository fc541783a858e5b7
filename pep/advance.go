package pep

import (
	"go.opentelemetry.io/otel/trace"

	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/fault"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/webhook"
)

// Advancing an open approval task: read the backend's status endpoint
// (authoritative: a callback or a look only wakes the task), and
// act on what it says. On approval, re-evaluate with the approval and act on
// the PDP's answer: execute (execute.go), retry later, open a new request
// (chain), or deny.

// Wake advances task id in the background because the backend called back
// about its request backendID, if the task is still waiting on that
// request (a callback about an earlier generation's request is ignored).
// The callback only wakes the task: Advance re-reads the status endpoint
// before acting. The advance starts once the callback has been answered and
// marked handled (webhook.AfterHandled), so a crash while it runs leaves
// the backend nothing to deliver again. At most cap(g.advance) wake-ups run
// at once; past that, and once the gate has stopped, the task's look is
// brought forward instead, for the next round of any replica's sweep. The
// error is only that of the check.
func (g *Gate) Wake(ctx context.Context, id, backendID string) error {
	if current, err := isPending(ctx, g.cfg.DB, id, backendID); err != nil || !current {
		return err
	}
	callback := trace.SpanContextFromContext(ctx)
	start := func() { g.wake(id, callback) }
	if !webhook.AfterHandled(ctx, start) {
		start()
	}
	return nil
}

// wake starts Advance of task id under the gate's context, within the
// callback's trace, or brings its look forward.
func (g *Gate) wake(id string, callback trace.SpanContext) {
	select {
	case g.advance <- struct{}{}:
	default: // busy
		g.lookNow(id)
		return
	}
	started := g.spawn(func(ctx context.Context) {
		defer func() { <-g.advance }()
		ctx = trace.ContextWithSpanContext(ctx, callback)
		ctx, cancel := context.WithTimeout(ctx, g.LookLease())
		defer cancel()
		if _, err := g.Advance(ctx, id); err != nil && g.bg.life.Err() == nil {
			g.cfg.Log.WarnContext(ctx, "advance after callback failed; the task's next look retries", "task_id", id, "error", err)
		}
	})
	if !started { // stopping
		<-g.advance
		g.lookNow(id)
	}
}

// lookNow brings task id's look forward to now; if that fails, the look
// already scheduled stands.
func (g *Gate) lookNow(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := lookSoon(ctx, g.cfg.DB, id, g.now()); err != nil {
		g.cfg.Log.WarnContext(ctx, "a woken task's look could not be brought forward; its next look stands", "task_id", id, "error", err)
	}
}

// Advance moves approval task id forward: it reads the backend's status
// endpoint (authoritative; a callback only wakes us), and on approval
// re-evaluates with the approval and executes. It is safe to run several
// times concurrently (callback and sweep): every step is a conditional
// update and the execution claim admits one winner. It schedules the
// task's next look and returns when that is (zero: nothing more to do);
// on an error the look already scheduled stands.
func (g *Gate) Advance(ctx context.Context, id string) (time.Time, error) {
	return g.advanceTask(ctx, id, false)
}

// advanceTask is Advance; repeated says the caller of a deferred task has made
// its call again (interim.go), so an approved one runs now.
func (g *Gate) advanceTask(ctx context.Context, id string, repeated bool) (time.Time, error) {
	a, err := getApproval(ctx, g.cfg.DB, id)
	if errors.Is(err, tasks.ErrNotFound) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, err
	}
	next, err := g.step(ctx, a, repeated)
	if err == nil && !next.IsZero() {
		if err = scheduleLook(ctx, g.cfg.DB, a, next); err != nil {
			err = fmt.Errorf("pep: task %s: schedule the next look: %w", a.TaskID, err)
		}
	}
	return next, err
}

// step is Advance of a as read.
func (g *Gate) step(ctx context.Context, a *approvalTask, repeated bool) (time.Time, error) {
	ctx, span := g.span(ctx, "pep.advance", a)
	defer span.End()
	switch a.Phase {
	case phaseClaimed:
		return g.reapClaim(ctx, a)
	case phaseInput:
		return g.awaitInput(ctx, a)
	case phasePending:
	default:
		return time.Time{}, nil
	}
	tr, retryAfter, err := g.cfg.Backend.Status(ctx, *a.StatusURL)
	if err != nil {
		if arapclient.IsProblem(err, authzen.ProblemUnknownTask) || arapclient.IsProblem(err, authzen.ProblemTaskExpired) {
			return time.Time{}, g.deny(ctx, a, "The approval request is no longer known to the approval service; the tool did not run.")
		}
		if a.Deadline != nil && g.now().After(a.Deadline.Add(time.Minute)) {
			return time.Time{}, g.fail(ctx, a, "the approval service was unreachable until the request's deadline passed")
		}
		g.cfg.Log.WarnContext(ctx, "status read failed; will retry", "task_id", a.TaskID, "error", err.Error())
		return g.backoff(a, 0), nil
	}
	if tr.Task.ID != *a.BackendID {
		return time.Time{}, nil // a stale generation's answer: ignored
	}
	switch tr.Task.Status {
	case authzen.StatusApproved:
		if tr.Result == nil || tr.Result.Mode != authzen.ModeReevaluate || tr.Result.Approval == nil {
			return time.Time{}, g.deny(ctx, a, "The approval came back in a form this server cannot enforce; the tool did not run.")
		}
		if a.Deferred && !repeated {
			return g.awaitCaller(ctx, a, tr.Result.Approval)
		}
		return g.reevaluate(ctx, a, tr.Result.Approval)
	case authzen.StatusDenied:
		if brokenBuild && broken(violateExecuteAfterDenial) {
			if b, err := g.binding(a); err == nil {
				if tool, err := g.catalog.lookup(a.Tool); err == nil {
					_, _ = tool.Run(ctx, Invocation{DB: g.cfg.DB, TaskID: a.TaskID, Principal: b.Principal, Args: b.Args})
				}
			}
		}
		return time.Time{}, g.deny(ctx, a, "The approval was denied; the tool did not run.")
	case authzen.StatusExpired:
		if brokenBuild && broken(violateExpiryUnexplained) {
			return time.Time{}, g.deny(ctx, a, "Not approved; the tool did not run.")
		}
		return time.Time{}, g.deny(ctx, a, msgRequestExpired)
	case authzen.StatusCancelled:
		if brokenBuild && broken(violateBackendCancelIgnored) {
			return g.backoff(a, 0), nil
		}
		return time.Time{}, g.cancelLocal(ctx, a, "The approval request was cancelled at the approval service; the tool did not run.")
	case authzen.StatusFailed:
		return time.Time{}, g.fail(ctx, a, "the approval service could not complete the request")
	default: // pending, or a status we do not know: not approved
		if err := g.extendDeadline(ctx, a, tr.Task.ExpiresAt); err != nil {
			return time.Time{}, err
		}
		if a.Deadline != nil && g.now().After(*a.Deadline) {
			// Past the window this server accepts (MaxWindow): the backend
			// would wait longer, this task does not. The task ends first:
			// the cancel's own callback would otherwise find the request
			// cancelled and end the task as cancelled instead.
			if err := g.deny(ctx, a, msgWindowExpired); err != nil {
				return time.Time{}, err
			}
			if a.CancelURL != nil && *a.CancelURL != "" {
				g.cancelBackend(ctx, *a.CancelURL)
			}
			return time.Time{}, nil
		}
		return g.backoff(a, max(retryAfter, g.undecidedPoll())), nil
	}
}

// Expiry wording (SEP-2848: the body notes the expiry).
const (
	msgRequestExpired = "The approval request expired without a decision; the tool did not run."
	msgWindowExpired  = "The approval request expired: it was not decided within the time this server allows; the tool did not run."
	msgInputExpired   = "The approval request expired: the information a new approval needs was not given in time; the tool did not run."
)

// awaitInput is a look at a task waiting for in-task input: past its
// deadline (the input's, set when it was asked for) it ends, expired;
// before it, the next look is at the deadline.
func (g *Gate) awaitInput(ctx context.Context, a *approvalTask) (time.Time, error) {
	if a.Deadline == nil || !g.now().Before(*a.Deadline) {
		return time.Time{}, g.deny(ctx, a, msgInputExpired)
	}
	return *a.Deadline, nil
}

// extendDeadline learns a later deadline the backend reports for the task's
// current request while it is pending (an ARS may extend a request's
// expires_at): the task's deadline moves up to it, but never past the window
// this server accepts (window_end, from --max-window), and its TTL is
// extended to cover the new deadline plus result retention, so the task is
// not announced as gone while it may still be decided. Neither ever moves
// back: an earlier expires_at ends the request at the backend, which the
// status read then reports.
func (g *Gate) extendDeadline(ctx context.Context, a *approvalTask, expiresAt *time.Time) error {
	if expiresAt == nil || a.Deadline == nil || !expiresAt.After(*a.Deadline) {
		return nil
	}
	var deadline time.Time
	err := pgx.BeginFunc(ctx, g.cfg.DB, func(tx pgx.Tx) error {
		var err error
		if deadline, err = moveDeadline(ctx, tx, a.TaskID, a.Generation, *expiresAt); err != nil || deadline.IsZero() {
			return err
		}
		return g.tasks.KeepUntilTx(ctx, tx, a.TaskID, deadline.Add(g.cfg.ResultRetention))
	})
	if err != nil {
		return fmt.Errorf("pep: task %s: extend deadline: %w", a.TaskID, err)
	}
	if !deadline.IsZero() {
		a.Deadline = &deadline
	}
	return nil
}

// SafetyPoll is how often an undecided request is read when the backend
// calls back: the callback wakes the task, so the poll only covers a
// callback that never came (the backend retries deliveries for hours).
// Polling at the client's pace instead would make the backend's status
// reads grow with the number of pending tasks (docs/performance.md, "gate").
const SafetyPoll = 30 * time.Second

// undecidedPoll is the least wait before reading an undecided request again.
func (g *Gate) undecidedPoll() time.Duration {
	if g.cfg.CallbackURL != "" {
		return SafetyPoll
	}
	return g.cfg.PollInterval
}

// backoff schedules the next status read: exponential from the poll
// interval to a minute, with jitter, never sooner than Retry-After, and
// no later than just past the task's deadline (which then ends it).
func (g *Gate) backoff(a *approvalTask, retryAfter time.Duration) time.Time {
	age := g.now().Sub(a.CreatedAt)
	wait := g.cfg.PollInterval
	for wait < age/4 && wait < time.Minute {
		wait *= 2
	}
	wait = min(wait, time.Minute)
	wait += time.Duration(rand.Float64() * 0.2 * float64(wait))
	next := g.now().Add(max(wait, retryAfter))
	if a.Deadline != nil && next.After(a.Deadline.Add(time.Second)) && g.now().Before(*a.Deadline) {
		next = a.Deadline.Add(time.Second)
	}
	return next
}

// reevaluate asks the PDP again with the approval as an input and acts on
// the answer (SEP-2848 "Completion").
func (g *Gate) reevaluate(ctx context.Context, a *approvalTask, approval *authzen.Approval) (time.Time, error) {
	ctx, span := g.span(ctx, "pep.reevaluate", a)
	defer span.End()
	b, err := g.binding(a)
	if err != nil {
		return time.Time{}, g.fail(ctx, a, "the stored call binding is damaged")
	}
	// The approval is for the tool as it was: a changed one is not asked
	// about (nor a new request opened for it).
	tool, why, err := g.current(a, b)
	if err != nil {
		return time.Time{}, err // the next look tries again
	}
	if why != "" {
		return time.Time{}, g.deny(ctx, a, why)
	}
	req := evaluation(b.Principal, &tool.Tool, b.Args)
	req.Context = authzen.Object{authzen.CtxApproval: approval}
	d, err := g.cfg.Backend.Evaluate(ctx, req)
	if err != nil {
		g.cfg.Log.WarnContext(ctx, "re-evaluation failed; will retry", "task_id", a.TaskID, "error", err.Error())
		return g.backoff(a, 0), nil
	}
	if d.Decision {
		until := approval.ApprovedUntil
		if echo, ok := d.Context[authzen.CtxApproval].(map[string]any); ok {
			if s, ok := echo["approved_until"].(string); ok {
				if t, err := time.Parse(time.RFC3339, s); err == nil && t.Before(until) {
					until = t
				}
			}
		}
		// The evaluation that used the approval goes with the claim: from
		// it on, the backend refuses to revoke the approval.
		evalID, _ := d.Context[authzen.CtxEvaluationID].(string)
		return time.Time{}, g.execute(ctx, a, b, use{approvalID: approval.ID, evaluationID: evalID, until: until})
	}
	next, _ := d.Context[authzen.CtxNextAction].(string)
	reason, _ := d.Context[authzen.CtxReason].(string)
	if next == "" {
		next = map[string]string{authzen.ReasonApprovalExpired: authzen.NextActionRequest, authzen.ReasonOutOfScope: authzen.NextActionRequest,
			authzen.ReasonGrantPending: authzen.NextActionRetry}[reason]
	}
	if brokenBuild && broken(violateExecuteAfterExpiry) && reason == authzen.ReasonApprovalExpired {
		return time.Time{}, g.execute(ctx, a, b, use{approvalID: approval.ID, until: g.now().Add(time.Hour)})
	}
	if brokenBuild && broken(violateRetryPastExpiry) && reason == authzen.ReasonApprovalExpired {
		return g.backoff(a, 0), nil // retried for ever on the expired approval
	}
	switch next {
	case authzen.NextActionRetry:
		if brokenBuild && broken(violateRetryAsDenial) {
			return time.Time{}, g.deny(ctx, a, "The approval cannot be used yet; the tool did not run.")
		}
		if !g.now().Before(approval.ApprovedUntil) {
			// It expired while the answer came back: look once more, and
			// the PDP, which then sees it expired, says what follows (a new
			// request, or a denial), whatever the timing of this answer.
			return g.backoff(a, 0), nil // expired while answered
		}
		after := 0 * time.Second
		if n, ok := d.Context[authzen.CtxRetryAfter].(float64); ok && n > 0 {
			after = time.Duration(n) * time.Second
		}
		// The task waits for the grant while the approval lasts, which may
		// be past the request's deadline: it stays readable that long.
		if err := pgx.BeginFunc(ctx, g.cfg.DB, func(tx pgx.Tx) error {
			return g.tasks.KeepUntilTx(ctx, tx, a.TaskID, approval.ApprovedUntil.Add(g.cfg.ResultRetention))
		}); err != nil {
			return time.Time{}, err
		}
		// Retries stop once the approval expires (SEP-2848): a hint past
		// approved_until is cut to it, and that look finds it expired.
		next := g.backoff(a, after)
		if next.After(approval.ApprovedUntil) {
			next = approval.ApprovedUntil
		}
		return next, nil
	case authzen.NextActionRequest:
		if hint, ok := d.AccessRequest(); ok {
			return time.Time{}, g.chain(ctx, a, tool, b, d, hint)
		}
	}
	return time.Time{}, g.deny(ctx, a, "After the approval, the policy still does not allow this call; the tool did not run.")
}

// chain opens a new request for the same call when re-evaluation says the
// approval does not suffice (next_action request). The current generation is
// consumed first, atomically, so a late callback or poll for it can no
// longer act; the number of chained requests is bounded.
func (g *Gate) chain(ctx context.Context, a *approvalTask, tool *offered, b binding, d authzen.Decision, hint *authzen.AccessRequestHint) error {
	if a.Chained+1 >= g.cfg.MaxChained && !(brokenBuild && broken(violateChainUnbounded)) {
		if d.Context[authzen.CtxReason] == authzen.ReasonApprovalExpired {
			return g.deny(ctx, a, "The approval expired before it could be used, and too many new approval requests were made for this call; the tool did not run.")
		}
		return g.deny(ctx, a, "The approval did not cover this call and too many new approval requests were made for it; the tool did not run.")
	}
	var schema map[string]any
	if hint.RequestSchemaURL != "" {
		s, err := g.requestSchema(ctx, hint.RequestSchemaURL)
		if err != nil {
			return err
		}
		if _, required := contextFields(s); len(required) > 0 {
			schema = s
		}
	}
	if schema == nil {
		return g.reopen(ctx, a, tool, b, d, hint, nil, phasePending, "")
	}
	// The new request needs input the task does not have: ask in-task
	// (Update, in kind.go, takes the answer).
	form, _ := contextFields(schema)
	key := inputKeyPrefix + newKey()[4:14]
	defer fault.Point("pep.after-ask")
	return pgx.BeginFunc(ctx, g.cfg.DB, func(tx pgx.Tx) error {
		// The answer is awaited while the requestable denial it answers
		// lasts: the ask sets the deadline and the look that ends the
		// task then, in its own UPDATE.
		if moved, err := askTx(ctx, tx, a, schema, hint.ExpiresAt); err != nil || !moved {
			return err
		}
		_, err := g.tasks.TransitionTx(ctx, tx, a.TaskID, tasks.Change{To: tasks.InputRequired,
			StatusMessage: "A new approval is needed (" + describe(hint) + "); please provide the requested information.",
			InputRequests: map[string]any{key: map[string]any{"method": "elicitation/create", "params": map[string]any{
				"mode": "form", "message": "A new approval is needed: " + describe(hint) + ". Please provide the information the approvers need.",
				"requestedSchema": form}}},
			Meta: brokenInputMeta(map[string]any{MetaAuthorization: envelope(RemediationAvailable, false)})})
		return err
	})
}
