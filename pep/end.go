package pep

import (
	"context"

	"github.com/jackc/pgx/v5"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/omcp/arap/mcp/tasks"
)

// How a task ends without running, always before the claim: denied (a
// CallToolResult saying so), failed (a JSON-RPC error), or cancelled. Each
// is one conditional move to done, with the task's terminal status and its
// audit event in the same transaction.

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
// ever used before the claim, so a possible side effect is never hidden).
func (g *Gate) fail(ctx context.Context, a *approvalTask, why string) error {
	return pgx.BeginFunc(ctx, g.cfg.DB, func(tx pgx.Tx) error {
		ended, backendID, err := endTx(ctx, tx, a, moveEnd, "")
		if err != nil || !ended {
			return err
		}
		t, err := g.tasks.TransitionTx(ctx, tx, a.TaskID, tasks.Change{To: tasks.Failed, StatusMessage: "The approval could not be completed; the tool did not run.",
			Error: &tasks.Error{Code: tasks.CodeInternalError, Message: why}, KeepUntil: g.retained()})
		if err != nil {
			return err
		}
		return g.audit(ctx, tx, a.TaskID, AuditFailed, actorPEP, *t.TerminalAt, map[string]any{"generation": a.Generation, "backend_request_id": backendID, "error": why})
	})
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
	return a, a != nil, err
}

// cancelLocal cancels a before the claim, as the PEP's own decision.
func (g *Gate) cancelLocal(ctx context.Context, a *approvalTask, msg string) error {
	_, _, err := g.cancelLocalWon(ctx, a.TaskID, msg, actorPEP)
	return err
}
