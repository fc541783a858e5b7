package pep

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/omcp/arap/internal/fault"
	"github.com/omcp/arap/mcp/tasks"
)

// Executing an approved call, at most once: the claim, the run, and its
// outcome recorded through finish (end.go). A claim whose outcome never got
// recorded ends outcome-unknown (reapClaim) and is never run again.

// execute claims the task and runs the tool, at most once. The claim is one
// compare-and-set (pending -> claimed, in the current generation, while the
// caller still has a live token), mutually exclusive with cancel and expiry,
// and records the claim in the audit trail in the same transaction. Every
// check holds at the claim: the approval not expired (at the claim's own
// time), the caller still valid (in the claim's statement), the binding
// intact (read before). A run once claimed is authorized: an approval that
// expires, or a token revoked, while the tool runs does not undo the claim,
// and the outcome is recorded as it is, even if ctx ends meanwhile (a
// stopping process records what it ran rather than leave it unknown).
// use is the approval a re-evaluation allowed the call with: its id, the
// evaluation that used it (recorded at the backend under the approval's
// lock, after which the approval cannot be revoked), and until when it may
// be claimed.
type use struct {
	approvalID, evaluationID string
	until                    time.Time
}

func (g *Gate) execute(ctx context.Context, a *approvalTask, b binding, u use) error {
	approvedUntil := u.until
	ctx, span := g.span(ctx, "pep.execute", a)
	defer span.End()
	start, now := time.Now(), g.now() // start: for the run's deadline, on the real clock
	if !now.Before(approvedUntil) {
		return g.deny(ctx, a, "The approval expired before the tool could run; the tool did not run.")
	}
	// The tool must still be the one approved, and the arguments fit it
	// now: checked here, just before the claim (reevaluate checked it
	// before asking the PDP; the source may have changed since).
	tool, why, err := g.current(a, b)
	if err != nil {
		return err
	}
	if why != "" {
		return g.deny(ctx, a, why)
	}
	execDeadline := now.Add(g.cfg.ExecTimeout)
	// The run ends early enough that its outcome is written before the
	// deadline: past it, a claim without a record is reaped outcome-unknown.
	runDeadline := start.Add(g.cfg.ExecTimeout - recordReserve(g.cfg.ExecTimeout))
	// The claim, the TTL to cover the run and the audit chain's head in one
	// pipeline with its BEGIN; then the claim's audit event with the COMMIT. A
	// lost claim rolls it all back.
	claimed := false
	var backendID *string
	var kept *tasks.Task
	var head auditHead
	batch := &pgx.Batch{}
	queueClaim(batch, a, now, execDeadline, &claimed, &backendID)
	g.tasks.QueueKeep(batch, a.TaskID, execDeadline.Add(g.cfg.ResultRetention), &kept)
	queueAuditHead(batch, a.TaskID, &head)
	_, err = inTx(ctx, g.cfg.DB, batch, func(next *pgx.Batch) (bool, error) {
		if !claimed {
			return false, nil
		}
		return true, queueAppendAudit(next, head, a.TaskID, AuditClaimed, actorPEP, now, map[string]any{
			"generation": a.Generation, "tool": a.Tool, "args_digest": a.ArgsDigest, "principal": a.Principal,
			"backend_request_id": backendID, "approval_id": u.approvalID, "evaluation_id": u.evaluationID, "approved_until": approvedUntil.UTC().Format(time.RFC3339Nano),
			"exec_deadline": execDeadline.UTC().Format(time.RFC3339Nano), "tool_digest": tool.Digest, "upstream": tool.Upstream, "upstream_tool": tool.UpstreamTool})
	})
	if err = movedChain(AuditClaimed, a.TaskID, err); err != nil {
		return err
	}
	if !claimed {
		// Only a caller gone invalid is this call's to act on: it ends the
		// task (if it is still before the claim, in this generation).
		if ok, err := g.callers.Valid(ctx, b.Principal); err != nil || ok {
			return err
		}
		return g.deny(ctx, a, "The caller is no longer authorized; the tool did not run.")
	}
	fault.Point("pep.after-claim")
	// From here on the run and its record outlive ctx: bounded by the
	// execution deadline, and then by the time to write the outcome.
	ctx = context.WithoutCancel(ctx)
	runCtx, cancel := context.WithDeadline(ctx, runDeadline)
	args := b.Args
	if brokenBuild && broken(violateArgumentsTruncated) { // runs from a binding that lost an argument
		args = map[string]any{}
		for k, v := range b.Args {
			if k != "to" {
				args[k] = v
			}
		}
	}
	out, runErr := runClaimed(runCtx, tool, Invocation{DB: g.cfg.DB, TaskID: a.TaskID, Principal: b.Principal, Args: args})
	cancel()
	if brokenBuild && broken(violateSecondExecution) && runErr == nil {
		_, _ = tool.Run(ctx, Invocation{DB: g.cfg.DB, TaskID: a.TaskID, Principal: b.Principal, Args: b.Args})
	}
	fault.Point("pep.after-invoke")
	var ue *UpstreamError
	if errors.As(runErr, &ue) {
		// Not the cause: it may hold the upstream's URL.
		g.cfg.Log.WarnContext(ctx, "upstream failed after the claim", "task_id", a.TaskID, "upstream", ue.Upstream, "what", ue.Message, "maybe_ran", ue.MaybeRan)
		recordCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if ue.MaybeRan {
			// The request may have reached the tool: never sent again.
			return g.unknown(recordCtx, a, ue.shown())
		}
		return g.failRan(recordCtx, a, ue.shown())
	}
	var res *sdk.CallToolResult
	disposition := ApprovedExecuted
	switch {
	case runErr != nil:
		disposition = ExecutionError
		res = &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{
			Text: "The tool ran after approval but failed, so it may have had side effects: " + sanitize(runErr.Error(), 200)}}}
		switch {
		case brokenBuild && broken(violateExecutionErrorSaysNotRun):
			res.Content = []sdk.Content{&sdk.TextContent{Text: "The tool did not run: " + sanitize(runErr.Error(), 200)}}
		case brokenBuild && broken(violateExecutionErrorAsSuccess):
			disposition = ApprovedExecuted
		}
	case out.Input != nil:
		// The tasks extension would let a task ask its client (status
		// input_required, answered by tasks/update), but this run is one
		// claimed, bounded call: the upstream's question cannot wait on a
		// person inside it, and its requestState cannot be re-sent after
		// the claim without a second forward. So the task ends, saying so.
		disposition = ExecutionError
		res = &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: "The upstream asked for more input (an MRTR input_required result) after approval. " +
			"An approved task cannot relay an upstream's question, so the call did not finish; the upstream received it, so it may have had effects before asking. " +
			"Check before calling the tool again."}}}
	case out.IsError:
		// The tool ran and reported an error (an upstream's isError): its
		// own words follow ours.
		disposition = ExecutionError
		res = out.result("The tool ran after approval but reported an error, so it may have had side effects.")
	default:
		res = out.result("Approved; the tool ran once.")
		if brokenBuild && broken(violateBodySilentOnRun) {
			res.Content = []sdk.Content{&sdk.TextContent{Text: "Approved. See the structured content."}}
		}
	}
	res.Meta = sdk.Meta{MetaDisposition: disposition}
	if brokenBuild && broken(violateNoDisposition) {
		res.Meta = nil
	}
	if brokenBuild && broken(violateEnvelopeOnExecuted) {
		res.Meta[MetaAuthorization] = envelope(RemediationUnavailable, false)
	}
	recordCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return g.finish(recordCtx, a, moveRan, res, disposition, "The tool ran after approval.", AuditCompleted, nil)
}

// runClaimed runs a claimed call's tool. A call its upstream never received
// for a reason that may pass (no connection: a restart, a network blip) is
// tried again until the run's deadline: after the claim an approved call
// has no second chance, and sending what was never sent cannot run it
// twice. Anything that may have reached the tool is never sent again.
func runClaimed(ctx context.Context, tool *offered, x Invocation) (Output, error) {
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		out, err := tool.Run(ctx, x)
		var ue *UpstreamError
		if !errors.As(err, &ue) || !ue.Transient || ue.MaybeRan {
			return out, err
		}
		select {
		case <-ctx.Done():
			return out, err
		case <-time.After(wait):
		}
	}
}

// recordReserve is the part of the execution deadline kept for writing a
// run's outcome: a fifth, at most 5s.
func recordReserve(execTimeout time.Duration) time.Duration {
	return min(execTimeout/5, 5*time.Second)
}

// reapClaim ends a claimed task whose execution deadline has passed without
// a recorded result: the tool may have run, so the outcome is unknown. It is
// never run again.
func (g *Gate) reapClaim(ctx context.Context, a *approvalTask) (time.Time, error) {
	if a.ExecDL == nil || g.now().Before(*a.ExecDL) {
		if a.ExecDL != nil {
			return *a.ExecDL, nil
		}
		return time.Time{}, nil
	}
	return time.Time{}, g.unknown(ctx, a, "")
}

// unknown ends claimed task a outcome-unknown: the tool may have run (why
// says what happened, "" for a run never recorded). It is never run again.
func (g *Gate) unknown(ctx context.Context, a *approvalTask, why string) error {
	text := "The tool may have run: it was started after approval, but its outcome could not be confirmed. Do not retry automatically; check whether it took effect."
	if why != "" {
		text += " (" + why + ")"
	}
	res := &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: text}},
		Meta: sdk.Meta{MetaDisposition: OutcomeUnknown}}
	return g.finish(ctx, a, moveRan, res, OutcomeUnknown, "Outcome unknown: the tool may have run.", AuditOutcomeUnknown, nil)
}
