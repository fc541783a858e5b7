package pep

import (
	"github.com/omcp/arap/internal/telemetry"

	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/fault"
	"github.com/omcp/arap/mcp/tasks"
)

// Opening an approval task for a requestable denial, crash-consistently:
// the intent (written and committed before the backend hears of it), the
// submission under its key, and the binding of the returned handle to the
// task. Also the two checks that come first (a live task for the same
// call; the per-caller limits), and reopen, which does the same for a later
// request of the same task.

// existing returns the live approval task with dedup key, waiting (briefly)
// for its handle to be bound: a task is never returned before that.
func (g *Gate) existing(ctx context.Context, dedup string) (*tasks.Task, error) {
	deadline := time.Now().Add(15 * time.Second)
	for {
		id, ph, err := liveTask(ctx, g.cfg.DB, dedup)
		if err != nil || id == "" {
			return nil, err
		}
		if ph != phaseSubmitting {
			return g.tasks.Get(ctx, g.cfg.DB, id)
		}
		if time.Now().After(deadline) {
			return nil, rpcError(tasks.CodeInternalError, "an identical call is still being submitted for approval; retry shortly")
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Limit denials: non-requestable, so the agent does not loop.
const (
	msgRate        = "Too many approval requests in the last minute; the tool did not run and no request was made. Wait before asking again."
	msgOutstanding = "Too many approval requests are already waiting for a decision; the tool did not run and no request was made. Wait for them or cancel some."
)

// limitError is a call refused by the per-caller limits.
type limitError struct{ msg string }

func (e *limitError) Error() string { return e.msg }

// lockLimits is the class (first key) of the transaction-scoped advisory
// lock that serializes one principal's task openings (second key: hashtext
// of the principal), so the limits are counted and taken in one step. Two
// principals whose hashes collide only wait for each other.
const lockLimits = 0x70657031 // "pep1"

// limits bound one caller's approval requests: opened in the last minute,
// and live. Approval fatigue is a known bypass, so requests per caller are
// bounded in rate and in number outstanding.
type limits struct{ perMinute, pending int }

func (g *Gate) limits() limits {
	if brokenBuild && broken(violateLimitsOff) {
		return limits{math.MaxInt32, math.MaxInt32}
	}
	return limits{g.cfg.SubmitsPerMinute, g.cfg.MaxPending}
}

// overLimit says which limit recent openings in the last minute and pending
// live tasks reach ("" for none), as the check under the principal's limit
// lock does (queueLimitCheck, in insert), which alone binds: two counts
// read outside it may both see room for one more.
func (g *Gate) overLimit(recent, pending int) string {
	l := g.limits()
	switch {
	case recent >= l.perMinute:
		return limitMessages[refusedRate]
	case pending >= l.pending:
		return limitMessages[refusedOutstanding]
	}
	return ""
}

// limitMessages are the refusals of queueLimitCheck, as a caller reads
// them.
var limitMessages = map[string]string{refusedRate: msgRate, refusedOutstanding: msgOutstanding}

// duplicateCall reports whether err is the refusal of a second live task
// for the same call (the unique dedup index of the approval tasks).
func duplicateCall(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == dedupIndex
}

// open makes the approval task for a requestable denial of b,
// crash-consistently: (1) in one transaction, under the principal's limit
// lock, the dedup check, the limits, and the task, its sealed call binding
// and a submission intent with a fresh idempotency key and the exact body;
// (2) the backend submission under that key; (3) in one transaction, the
// returned handle, bound to the task. Only then is the task returned. A
// crash between any two steps is repaired by Reconcile, which resubmits the
// intent (the key makes the backend return the same handle) and binds it,
// or cancels it if the task ended meanwhile. A repeated call (same
// principal, tool and arguments) while the task is live returns the same
// task, whatever the limits; a call over a limit returns a *limitError and
// nothing is written or submitted. A deferred task (interim.go) runs
// when its caller repeats the call rather than when approved. created says
// whether the task returned is new.
func (g *Gate) open(ctx context.Context, tool *offered, b binding, decision authzen.Decision, hint *authzen.AccessRequestHint, extra map[string]any, deferred bool) (t *tasks.Task, created bool, err error) {
	d, err := digest(b.Tool, b.Args)
	if err != nil {
		return nil, false, err
	}
	dedup := dedupKey(b.Principal, b.Tool, d)
	for range 3 {
		o, err := g.insert(ctx, tool, b, d, dedup, decision, hint, extra, deferred)
		if duplicateCall(err) {
			// A concurrent duplicate won; should its task have ended
			// since, try again.
			if t, err := g.existing(ctx, dedup); t != nil || err != nil {
				return t, false, err
			}
			continue
		}
		if err != nil {
			return nil, false, err
		}
		fault.Point("pep.after-intent")
		// The intent just written is in hand: no need to read it back.
		t, err := g.submitAndBindIntent(ctx, o.intent)
		if err != nil || t != nil {
			return t, t != nil, err
		}
		t, err = g.tasks.Get(ctx, g.cfg.DB, o.intent.TaskID)
		return t, err == nil, err
	}
	return nil, false, rpcError(tasks.CodeInternalError, "an identical call is changing state; retry shortly")
}

// opened is what insert wrote: the task's first submission intent.
type opened struct{ intent *intent }

// insert is step (1) of open. The task records the tool's identity (its
// digest, upstream and upstream tool) beside the call binding.
func (g *Gate) insert(ctx context.Context, tool *offered, b binding, d, dedup string, decision authzen.Decision, hint *authzen.AccessRequestHint, extra map[string]any, deferred bool) (opened, error) {
	taskID, key := tasks.NewID(), newKey()
	if brokenBuild && broken(violateClockTaskIDs) {
		taskID = fmt.Sprintf("tsk_%d", time.Now().UnixNano())
	}
	body, err := g.submission(&tool.Tool, b, decision, hint, extra, taskID)
	if err != nil {
		return opened{}, err
	}
	plainBinding, err := json.Marshal(b)
	if err != nil {
		return opened{}, err
	}
	p, now := b.Principal, g.now()
	ttl := tasks.TTLUntil(now, hint.ExpiresAt.Add(g.cfg.ResultRetention)) // provisional: extended when bound
	submitURL := g.submitURL(hint)
	// One pipeline, one implicit transaction: the lock, the writes, and
	// the limits' check the lock guards. A live task for the same call
	// fails the insert (the unique dedup index), and a limit reached fails
	// the check: either way nothing is written.
	batch := &pgx.Batch{}
	queueLimitLock(batch, p.Key())
	g.tasks.QueueCreate(batch, &tasks.Task{
		ID: taskID, Principal: p.Key(), Kind: KindApproval, Status: tasks.Working,
		StatusMessage: "Waiting for approval: " + describe(hint) + brokenStatusArgs(b.Args), Meta: pendingMeta(), CreatedAt: now,
		TTLMs: &ttl, PollIntervalMs: int(g.cfg.PollInterval.Milliseconds()),
	})
	queueApproval(batch, newApproval{TaskID: taskID, Tool: b.Tool, ArgsSealed: g.box.Seal(plainBinding, taskID), ArgsDigest: d,
		Principal: p.Key(), Dedup: dedup, At: now, ToolDigest: tool.Digest, Upstream: tool.Upstream, UpstreamTool: tool.UpstreamTool,
		TraceParent: telemetry.TraceParent(ctx), Deferred: deferred,
		Intent: newIntent{Key: key, Generation: 1, SubmitURL: submitURL, BodySealed: g.box.Seal(body, key)}})
	queueLimitCheck(batch, p.Key(), now.Add(-time.Minute), g.limits())
	err = g.cfg.DB.SendBatch(ctx, batch).Close()
	if msg, over := limitMessages[refusalOf(err)]; over {
		return opened{}, &limitError{msg: msg}
	}
	switch {
	case err == nil:
		return opened{intent: &intent{Key: key, TaskID: taskID, SubmitURL: submitURL, State: intentOpen, Generation: 1, Body: body}}, nil
	case duplicateCall(err):
		return opened{}, err
	}
	return opened{}, fmt.Errorf("pep: record intent: %w", err)
}

// submitAndBind is steps (2) and (3) of open: it submits intent key and
// binds the handle to its task.
func (g *Gate) submitAndBind(ctx context.Context, key string) error {
	in, err := g.loadIntent(ctx, key)
	if errors.Is(err, errIntentEnded) {
		return nil // bound or settled by another (the reconciler)
	}
	if err != nil {
		return err
	}
	_, err = g.submitAndBindIntent(ctx, in)
	return err
}

// submitAndBindIntent is submitAndBind of intent in, as written; it
// returns the task as bound (nil if another binder bound it, or it moved
// on).
func (g *Gate) submitAndBindIntent(ctx context.Context, in *intent) (*tasks.Task, error) {
	tr, err := g.submit(ctx, in)
	fault.Point("pep.after-submit")
	if err != nil {
		g.cfg.Log.WarnContext(ctx, "approval request not submitted", "task_id", in.TaskID, "error", err.Error())
		if ferr := g.failIntent(ctx, in, !errors.Is(err, errUncertain), err); ferr != nil {
			return nil, ferr
		}
		if backendUnavailable(err) {
			return nil, tasks.Unavailable(tasks.WhatApproval + " (the request was not submitted; the tool did not run)")
		}
		return nil, rpcError(tasks.CodeInternalError, "the approval request could not be submitted; the tool did not run")
	}
	return g.bindTask(ctx, in, tr)
}

// errIntentEnded is loadIntent's answer for an intent that has ended
// (bound or failed): its body is dropped and nothing is left to submit.
var errIntentEnded = errors.New("pep: intent ended")

// loadIntent reads intent key and opens its body.
func (g *Gate) loadIntent(ctx context.Context, key string) (*intent, error) {
	in, sealed, err := getIntent(ctx, g.cfg.DB, key)
	if err != nil {
		return nil, err
	}
	if sealed == nil {
		return nil, errIntentEnded
	}
	if in.Body, err = g.box.Open(sealed, key); err != nil {
		return nil, err
	}
	return in, nil
}

// submit sends an intent. A 4xx problem is a definite refusal (nothing was
// created); anything else is uncertain and can only be settled by
// resubmitting the same key.
func (g *Gate) submit(ctx context.Context, in *intent) (authzen.TaskResponse, error) {
	var tr authzen.TaskResponse
	err := retryTransient(ctx, func() (err error) {
		tr, err = g.cfg.Backend.SubmitBody(ctx, in.SubmitURL, in.Key, in.Body)
		return err
	})
	if err != nil && !refused(err) {
		return authzen.TaskResponse{}, fmt.Errorf("%w: %w", errUncertain, err)
	}
	return tr, err
}

// bind records the handle of intent in's request on its task, extends the
// TTL to the request's deadline plus retention, and schedules the task's
// first look. If
// the task ended before the handle arrived (cancelled), the request is
// cancelled instead.
func (g *Gate) bind(ctx context.Context, in *intent, tr authzen.TaskResponse) error {
	_, err := g.bindTask(ctx, in, tr)
	return err
}

// bindTask is bind, returning the task as this binding left it (nil when
// it did not take the handle).
func (g *Gate) bindTask(ctx context.Context, in *intent, tr authzen.TaskResponse) (*tasks.Task, error) {
	windowEnd := g.now().Add(g.cfg.MaxWindow)
	deadline := windowEnd
	if tr.Task.ExpiresAt != nil && tr.Task.ExpiresAt.Before(deadline) {
		deadline = *tr.Task.ExpiresAt
	}
	cancelURL, _ := tr.Task.Links["cancel"].(string)
	first := g.now().Add(g.undecidedPoll())
	if first.After(deadline.Add(time.Second)) {
		first = deadline.Add(time.Second) // the deadline ends it, if nothing else does
	}
	h := handle{BackendID: tr.Task.ID, StatusURL: tr.Task.StatusEndpoint, CancelURL: cancelURL,
		Deadline: deadline, WindowEnd: windowEnd, FirstLook: first}
	// The usual case in one pipeline, one implicit transaction: the handle
	// on intent and task, and the TTL raised to cover the deadline. A bind
	// lost to another binder or to the task's end fails it (the TTL of a
	// task that is not this request's stays as it was), and its handle is
	// recorded on the intent alone below.
	var t *tasks.Task
	b := &pgx.Batch{}
	queueBindOrRefuse(b, in, h)
	g.tasks.QueueKeep(b, in.TaskID, deadline.Add(g.cfg.ResultRetention), &t)
	err := g.cfg.DB.SendBatch(ctx, b).Close()
	bound := err == nil
	if refusalOf(err) == refusedHandle {
		t = nil
		err = pgx.BeginFunc(ctx, g.cfg.DB, func(tx pgx.Tx) error {
			won, held, err := bindHandle(ctx, tx, in, h)
			if err != nil {
				return err
			}
			if won { // not after losing above, but kept as bound if it ever is
				bound = true
				t, err = g.tasks.KeepTx(ctx, tx, in.TaskID, deadline.Add(g.cfg.ResultRetention))
				return err
			}
			// Either another binder (the reconciler, or the submitter when
			// the reconciler lost) bound this same request first: it is the
			// task's and stays; or the task moved on (cancelled) without it:
			// cancel it below.
			bound = held != nil && *held == tr.Task.ID
			return nil
		})
	}
	if err != nil {
		return nil, fmt.Errorf("pep: bind handle: %w", err)
	}
	fault.Point("pep.after-handle")
	if !bound && cancelURL != "" {
		g.cancelBackend(ctx, cancelURL)
	}
	return t, nil
}

// submitFailure says why a submission failed in words a caller may read: the
// backend's refusal by its problem code, or that it could not be reached or
// did not confirm; never the error's text, which names the backend's
// endpoints (ARAP URLs never reach an MCP client). The audit keeps the text.
func submitFailure(cause error) string {
	var pe *arapclient.ProblemError
	switch {
	case errors.As(cause, &pe) && !backendUnavailable(cause):
		return fmt.Sprintf("the approval service refused it (%d %s)", pe.Status, sanitize(pe.Code(), 80))
	case errors.Is(cause, errUncertain):
		return "the approval service did not confirm it"
	case backendUnavailable(cause):
		return "the approval service could not be reached"
	}
	return "internal error"
}

// failIntent ends a task whose request could not be made: failed (before any
// claim, so failed is allowed). An uncertain submission leaves the intent
// abandoned, so Reconcile finds and cancels a request that may exist.
func (g *Gate) failIntent(ctx context.Context, in *intent, refused bool, cause error) error {
	m := intentAbandon
	if refused {
		m = intentRefused
	}
	var ended bool
	err := pgx.BeginFunc(ctx, g.cfg.DB, func(tx pgx.Tx) error {
		var err error
		if ended, err = failIntentTx(ctx, tx, in, m); err != nil || !ended {
			return err
		}
		why := "approval request could not be submitted: " + sanitize(cause.Error(), 200)
		t, err := g.tasks.TransitionTx(ctx, tx, in.TaskID, tasks.Change{To: tasks.Failed, StatusMessage: "The approval request could not be submitted; the tool did not run.",
			Error: &tasks.Error{Code: tasks.CodeInternalError, Message: "approval request could not be submitted: " + submitFailure(cause)}, KeepUntil: g.retained()})
		if err != nil {
			return err
		}
		return g.audit(ctx, tx, in.TaskID, AuditFailed, actorPEP, *t.TerminalAt, map[string]any{"generation": in.Generation, "backend_request_id": nil, "error": why})
	})
	g.counted(ended, err, EndedFailed)
	return err
}

// reopen consumes generation a.Generation (from phase from: pending when
// chained, input when the input came, answering input key answered) and
// submits a new request for the same binding under a new intent, as open
// does for the first.
func (g *Gate) reopen(ctx context.Context, a *approvalTask, tool *offered, b binding, d authzen.Decision, hint *authzen.AccessRequestHint, extra map[string]any, from phase, answered string) error {
	key := newKey()
	body, err := g.submission(&tool.Tool, b, d, hint, extra, a.TaskID)
	if err != nil {
		return err
	}
	m, gen, chained := moveChain, a.Generation+1, true
	if from == phaseInput {
		m, gen, chained = moveAnswered, a.Generation, false // asking for input already advanced the generation
	}
	moved := false
	err = pgx.BeginFunc(ctx, g.cfg.DB, func(tx pgx.Tx) error {
		var err error
		moved, err = resubmitTx(ctx, tx, a, m, gen, chained, newIntent{Key: key, SubmitURL: g.submitURL(hint), BodySealed: g.box.Seal(body, key)})
		if err != nil || !moved {
			return err
		}
		var keys []string
		if answered != "" {
			keys = []string{answered}
		}
		_, err = g.tasks.TransitionTx(ctx, tx, a.TaskID, tasks.Change{To: tasks.Working,
			StatusMessage: "Waiting for a new approval: " + describe(hint), Meta: pendingMeta(), Answered: keys})
		return err
	})
	if err != nil || !moved {
		return err
	}
	fault.Point("pep.after-intent")
	err = g.submitAndBind(ctx, key)
	var rpc *jsonrpc.Error
	if errors.As(err, &rpc) {
		return nil // not submitted: submitAndBind has failed the task
	}
	return err
}
