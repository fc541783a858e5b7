package pep

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/omcp/arap/mcp/tasks"
)

// How a task ends. Before the claim, without running: denied (a
// CallToolResult saying so), failed (a JSON-RPC error), or cancelled; after
// it, with the run's outcome (execute). Each is one conditional move to
// done, with the task's terminal status and its audit event in the same
// transaction (finish).

// deny completes the task as a terminal denial: it did not run, and is
// fenced against any later approval or callback.
func (g *Gate) deny(ctx context.Context, a *approvalTask, text string) error {
	res := &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: text}},
		Meta: sdk.Meta{MetaDisposition: DeniedNotExecuted, MetaAuthorization: envelope(RemediationUnavailable, false)}}
	switch {
	case brokenBuild && broken(violateDispositionDisagrees):
		res.Meta[MetaDisposition] = ApprovedExecuted
	case brokenBuild && broken(violateDenialWithoutEnvelope):
		delete(res.Meta, MetaAuthorization)
	case brokenBuild && broken(violateDenialSilentOnRun):
		res.Content = []sdk.Content{&sdk.TextContent{Text: "Not approved."}}
	}
	return g.finish(ctx, a, moveEnd, res, DeniedNotExecuted, "Not approved; the tool did not run.", AuditDenied, map[string]any{"reason": text})
}

// fail ends a task before any claim with a JSON-RPC error (failed is only
// used where the tool certainly did not run, so a possible side effect is
// never hidden).
func (g *Gate) fail(ctx context.Context, a *approvalTask, why string) error {
	return g.failBy(ctx, a, moveEnd, AuditFailed, "The approval could not be completed; the tool did not run.", why)
}

// failRan ends a claimed task failed whose run certainly did not reach the
// tool (its upstream was not reached: an *UpstreamError that is not
// MaybeRan); it is never run again.
func (g *Gate) failRan(ctx context.Context, a *approvalTask, why string) error {
	return g.failBy(ctx, a, moveRan, AuditNotRun, "The tool could not be reached after approval; it did not run.", why)
}

func (g *Gate) failBy(ctx context.Context, a *approvalTask, m move, kind, msg, why string) error {
	var ended bool
	err := pgx.BeginFunc(ctx, g.cfg.DB, func(tx pgx.Tx) error {
		var backendID *string
		var err error
		if ended, backendID, err = endTx(ctx, tx, a, m, ""); err != nil || !ended {
			return err
		}
		t, err := g.tasks.TransitionTx(ctx, tx, a.TaskID, tasks.Change{To: tasks.Failed, StatusMessage: msg,
			Error: &tasks.Error{Code: tasks.CodeInternalError, Message: why}, KeepUntil: g.retained()})
		if err != nil {
			return err
		}
		return g.audit(ctx, tx, a.TaskID, kind, actorPEP, *t.TerminalAt, map[string]any{"generation": a.Generation, "backend_request_id": backendID, "error": why})
	})
	g.counted(ended, err, EndedFailed)
	return err
}

// cancelLocalWon moves a pre-claim task to cancelled on behalf of actor,
// whatever its generation. It reports whether this call won, with the task
// as it was.
func (g *Gate) cancelLocalWon(ctx context.Context, id, msg, actor string) (*approvalTask, bool, error) {
	var a *approvalTask
	err := pgx.BeginFunc(ctx, g.cfg.DB, func(tx pgx.Tx) error {
		var err error
		if a, err = cancelTx(ctx, tx, id); err != nil || a == nil {
			return err // claimed or ended already: the cancel is a no-op
		}
		t, err := g.tasks.TransitionTx(ctx, tx, id, tasks.Change{To: tasks.Cancelled, StatusMessage: msg, KeepUntil: g.retained()})
		if err != nil {
			return err
		}
		return g.audit(ctx, tx, id, AuditCancelled, actor, *t.TerminalAt, map[string]any{"generation": a.Generation, "backend_request_id": a.BackendID, "reason": msg})
	})
	if err != nil {
		a = nil
	}
	g.counted(a != nil, err, EndedCancelled)
	return a, a != nil, err
}

// cancelLocal cancels a before the claim, as the PEP's own decision.
func (g *Gate) cancelLocal(ctx context.Context, a *approvalTask, msg string) error {
	_, _, err := g.cancelLocalWon(ctx, a.TaskID, msg, actorPEP)
	return err
}

// finish completes approval task a with res by m (moveRan after a run,
// moveEnd for a denial), if it is still in one of m's phases and at the
// generation a was read at: a decision about an earlier request never ends
// the task after it has moved on to a new one. The audit event kind (with
// extra data) is written with it.
func (g *Gate) finish(ctx context.Context, a *approvalTask, m move, res *sdk.CallToolResult, disposition, msg, kind string, extra map[string]any) error {
	raw, err := json.Marshal(res)
	if err != nil {
		return err
	}
	sum, err := resultDigest(raw)
	if err != nil {
		return err
	}
	// The end, the task's completion and the audit chain's head in one
	// pipeline with its BEGIN; then the ending's audit event with the COMMIT. A
	// task that moved on meanwhile (the end changed nothing) rolls it all
	// back, whether its completion queued behind the end succeeded or was
	// refused as a conflict (the task had ended), which is no error of this
	// call.
	var ended bool
	var backendID *string
	var t *tasks.Task
	var head auditHead
	b := &pgx.Batch{}
	queueEnd(b, a, m, disposition, &ended, &backendID)
	g.tasks.QueueTransition(b, a.TaskID, tasks.Change{To: tasks.Completed, StatusMessage: msg, Result: raw, KeepUntil: g.retained()}, &t)
	queueAuditHead(b, a.TaskID, &head)
	_, err = inTx(ctx, g.cfg.DB, b, func(next *pgx.Batch) (bool, error) {
		if !ended {
			return false, nil // not this call's to end: the completion is rolled back
		}
		data := map[string]any{"generation": a.Generation, "backend_request_id": backendID, "disposition": disposition, "result_digest": sum}
		for k, v := range extra {
			data[k] = v
		}
		return true, queueAppendAudit(next, head, a.TaskID, kind, actorPEP, *t.TerminalAt, data)
	})
	err = movedChain(kind, a.TaskID, err)
	var conflict *tasks.ConflictError
	if !ended && errors.As(err, &conflict) {
		err = nil
	}
	g.counted(ended, err, disposition)
	return err
}

// counted counts a task this call ended, once its transaction committed.
func (g *Gate) counted(ended bool, err error, outcome string) {
	if ended && err == nil {
		g.cfg.Metrics.taskEnded(outcome)
	}
}

// retained is when a task ended now stops being readable.
func (g *Gate) retained() time.Time { return g.now().Add(g.cfg.ResultRetention) }
