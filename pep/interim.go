package pep

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/mcp/tasks"
)

// Approval as ordinary tools, for clients that do not drive tasks
// (Config.ApprovalTools). SEP-2848 allows it in the interim: "a server MAY
// also expose approval as ordinary tools ... carrying the same next-step
// fields (a hint, the request schema, a poll interval)".
//
// A requestable call from such a client opens the approval task a tasks
// client would get (open: crash-consistent, deduplicated, limited), but
// deferred: when its request is approved the task waits for its caller
// (awaitCaller) instead of running. The call's result says so and names a
// handle, the task's id (unguessable, visible to its principal only, no
// binding material), and the tool that follows it, approval_status. The
// same call made again finds the live task (its dedup key) and advances it
// as its caller (repeat): approved, it is re-evaluated, claimed and run
// exactly as a task is, and the caller gets the result; a changed call is
// another call, with its own approval. A deferred task is bounded as every
// task is: by its request's deadline, then by its approval's validity.

// ToolApprovalStatus follows an approval request made for a client without
// tasks.
const ToolApprovalStatus = "approval_status"

// MetaApproval carries the next-step fields on results about an approval
// request made for a client without tasks.
const MetaApproval = "io.github.omcp/approval"

// Statuses of approval_status (approvalState.Status).
const (
	StatusPending       = "pending"        // the request waits for a decision
	StatusApproved      = "approved"       // call the tool again to run it
	StatusRunning       = "running"        // the call was approved and runs now
	StatusInputRequired = "input_required" // a new request needs answers only a tasks client can give
	StatusCompleted     = "completed"      // the call ran (or may have): see the disposition
	StatusDenied        = "denied"         // not approved; the tool did not run
	StatusExpired       = "expired"        // not decided, or not used, in time; the tool did not run
	StatusCancelled     = "cancelled"
	StatusFailed        = "failed" // the request could not be made or followed; the tool did not run
)

// approvalState is approval_status's answer, and MetaApproval's value.
type approvalState struct {
	Handle         string `json:"handle"`
	Tool           string `json:"tool"` // the tool the request is for
	Status         string `json:"status"`
	Message        string `json:"message"`
	Next           string `json:"next"`           // what the agent does next
	FollowWith     string `json:"followWith"`     // the tool to follow it with
	PollIntervalMs int    `json:"pollIntervalMs"` // how often, at most
	ApprovedUntil  string `json:"approvedUntil,omitempty"`
	Disposition    string `json:"disposition,omitempty"`
}

// approvalStatusTool is approval_status as tools/list shows it.
func approvalStatusTool() *sdk.Tool {
	return &sdk.Tool{
		Name:  ToolApprovalStatus,
		Title: "Approval request status",
		Description: "Follow an approval request this server made for one of your tool calls. Give the handle the call's result named. " +
			"Statuses: pending (wait pollIntervalMs and ask again), approved (call the same tool again with the same arguments to run it, once), " +
			"running, completed, denied, expired, cancelled, failed. It never runs anything itself.",
		InputSchema: map[string]any{"type": "object", "additionalProperties": false, "required": []any{"handle"},
			"properties": map[string]any{"handle": map[string]any{"type": "string", "description": "the handle of the approval request"}}},
		OutputSchema: map[string]any{"type": "object", "required": []any{"handle", "status", "message", "next", "followWith", "pollIntervalMs"},
			"properties": map[string]any{
				"handle": map[string]any{"type": "string"}, "tool": map[string]any{"type": "string"},
				"status": map[string]any{"type": "string", "enum": []any{StatusPending, StatusApproved, StatusRunning, StatusInputRequired,
					StatusCompleted, StatusDenied, StatusExpired, StatusCancelled, StatusFailed}},
				"message": map[string]any{"type": "string"}, "next": map[string]any{"type": "string"}, "followWith": map[string]any{"type": "string"},
				"pollIntervalMs": map[string]any{"type": "integer"}, "approvedUntil": map[string]any{"type": "string"},
				"disposition": map[string]any{"type": "string"}}},
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: new(bool)},
	}
}

// interim answers a requestable call from a client without tasks: the
// live task for the same call, advanced as its caller (repeat), or a new
// deferred one. Input the request needs is collected first by MRTR, from a
// client that speaks it; one that cannot gets the degraded result.
func (g *Gate) interim(ctx context.Context, p Principal, tool *offered, args map[string]any, decision authzen.Decision,
	hint *authzen.AccessRequestHint, answers *inputAnswers, version string) (sdk.Result, error) {
	d, err := digest(tool.Name, args)
	if err != nil {
		return nil, err
	}
	if id, _, err := liveTask(ctx, g.cfg.DB, dedupKey(p, tool.Name, d)); err != nil || id != "" {
		if err != nil {
			return nil, err
		}
		return g.repeat(ctx, id)
	}
	extra, ask, err := g.collectInput(ctx, p, tool.Name, args, hint, answers)
	if err != nil {
		return nil, err
	}
	if ask != nil {
		if !tasksCapable(version) {
			return degraded(hint, version), nil
		}
		return ask, nil
	}
	t, fresh, err := g.open(ctx, tool, binding{Tool: tool.Name, Args: args, Principal: p}, decision, hint, extra, true)
	var le *limitError
	if errors.As(err, &le) {
		return denied(le.msg, RemediationUnavailable), nil
	}
	if err != nil {
		return nil, err
	}
	if !fresh { // a concurrent twin opened it: this is a repeat too
		return g.repeat(ctx, t.ID)
	}
	return g.interimResult(ctx, t)
}

// repeat is the call of deferred task id made again by its caller: the
// task is advanced as its caller would have it (approved: re-evaluated,
// claimed and run now), and the caller gets the outcome, or where it
// stands.
func (g *Gate) repeat(ctx context.Context, id string) (sdk.Result, error) {
	if _, err := g.advanceTask(ctx, id, true); err != nil {
		g.cfg.Log.WarnContext(ctx, "a repeated call's task could not be advanced; its look retries", "task_id", id, "error", err)
	}
	t, err := g.tasks.Get(ctx, g.cfg.DB, id)
	if err != nil {
		return nil, err
	}
	if t.Status.Terminal() {
		return endedResult(t), nil
	}
	return g.interimResult(ctx, t)
}

// taskFor is what a tasks client gets for task t, which it found live
// rather than opened (err is the lookup's): a deferred task's caller now
// drives tasks, so it runs on its own once approved.
func (g *Gate) taskFor(ctx context.Context, t *tasks.Task, _ bool, err error) (sdk.Result, error) {
	if err != nil || t == nil {
		return created(t), err
	}
	if _, err := undefer(ctx, g.cfg.DB, t.ID, g.now()); err != nil {
		return nil, err
	}
	return g.respond(ctx, t), nil
}

// Message of a deferred task whose approval expired before its caller
// made the call again.
const msgApprovalUnused = "The approval expired before the call was made again; the tool did not run."

// awaitCaller is a look at deferred task a whose request is approved: it
// waits for its caller until the approval expires, saying so in its status
// message; past that it ends, expired.
func (g *Gate) awaitCaller(ctx context.Context, a *approvalTask, approval *authzen.Approval) (time.Time, error) {
	until := approval.ApprovedUntil
	if !g.now().Before(until) {
		return time.Time{}, g.deny(ctx, a, msgApprovalUnused)
	}
	err := pgx.BeginFunc(ctx, g.cfg.DB, func(tx pgx.Tx) error {
		changed, err := markApproved(ctx, tx, a, until)
		if err != nil || !changed {
			return err
		}
		_, err = g.tasks.TransitionTx(ctx, tx, a.TaskID, tasks.Change{To: tasks.Working, Meta: pendingMeta(),
			StatusMessage: "Approved: call " + sanitize(a.Tool, 80) + " again with the same arguments to run it, before " + until.UTC().Format(time.RFC3339) + ".",
			KeepUntil:     until.Add(g.cfg.ResultRetention)})
		return err
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("pep: task %s: mark approved: %w", a.TaskID, err)
	}
	return until, nil
}

// state is where task t (read with its approval row a, nil if gone)
// stands, as approval_status and an interim result say it.
func (g *Gate) state(t *tasks.Task, a *approvalTask) approvalState {
	s := approvalState{Handle: t.ID, Status: StatusPending, Message: t.StatusMessage, FollowWith: ToolApprovalStatus,
		PollIntervalMs: t.PollIntervalMs}
	if a != nil {
		s.Tool = a.Tool
	}
	again := "call " + sanitize(s.Tool, 80) + " again with the same arguments"
	switch {
	case t.Status.Terminal():
		s.Status, s.Message = ended(t)
		s.Disposition = dispositionOf(t)
		s.Next = "Nothing: this request is over. A new call of the tool is a new request."
	case a == nil:
	case a.Phase == phaseClaimed:
		s.Status, s.Next = StatusRunning, "Wait pollIntervalMs and ask again; the call runs once."
	case a.Phase == phaseInput:
		s.Status, s.Next = StatusInputRequired, "A new approval needs information this client cannot give: repeat the call from a client that supports tasks, or cancel it."
	case a.ApprovedUntil != nil && a.Phase == phasePending:
		s.Status, s.ApprovedUntil = StatusApproved, a.ApprovedUntil.UTC().Format(time.RFC3339)
		s.Next = "Approved: " + again + " to run it, once, before approvedUntil."
	default:
		s.Next = "Wait pollIntervalMs and ask again with " + ToolApprovalStatus + "; when it says approved, " + again + "."
	}
	return s
}

// ended is the approval_status of terminal task t and what it says, from
// the result the task ended with (whose body notes an expiry: SEP-2848).
func ended(t *tasks.Task) (string, string) {
	switch t.Status {
	case tasks.Cancelled:
		return StatusCancelled, t.StatusMessage
	case tasks.Failed:
		msg := t.StatusMessage
		if t.Error != nil {
			msg = sanitize(t.Error.Message, 300)
		}
		return StatusFailed, msg
	}
	text := resultText(t.Result)
	if dispositionOf(t) != DeniedNotExecuted {
		return StatusCompleted, text
	}
	if strings.Contains(strings.ToLower(text), "expired") {
		return StatusExpired, text
	}
	return StatusDenied, text
}

// dispositionOf is completed task t's disposition ("" for none).
func dispositionOf(t *tasks.Task) string {
	var r struct {
		Meta map[string]any `json:"_meta"`
	}
	_ = json.Unmarshal(t.Result, &r)
	d, _ := r.Meta[MetaDisposition].(string)
	return d
}

// resultText is the text of a stored CallToolResult.
func resultText(raw json.RawMessage) string {
	var r struct {
		Content []struct {
			Type, Text string
		} `json:"content"`
	}
	_ = json.Unmarshal(raw, &r)
	var parts []string
	for _, c := range r.Content {
		if c.Type == "text" {
			parts = append(parts, c.Text)
		}
	}
	return strings.Join(parts, " ")
}

// endedResult is the answer to a call whose deferred task has ended: the
// result it stored (completed), or a tool error saying how it ended.
func endedResult(t *tasks.Task) *sdk.CallToolResult {
	if t.Status == tasks.Completed {
		var r sdk.CallToolResult
		if err := json.Unmarshal(t.Result, &r); err == nil {
			return &r
		}
	}
	_, msg := ended(t)
	return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: msg + " The tool did not run."}},
		Meta: sdk.Meta{MetaAuthorization: envelope(RemediationUnavailable, false)}}
}

// interimResult is the answer to a call whose deferred task t is not over:
// it has not run, and the next-step fields say how to follow it.
func (g *Gate) interimResult(ctx context.Context, t *tasks.Task) (sdk.Result, error) {
	a, err := getApproval(ctx, g.cfg.DB, t.ID)
	if err != nil && !errors.Is(err, tasks.ErrNotFound) {
		return nil, err
	}
	s := g.state(t, a)
	lead := "This call needs an approval and has not run. "
	if s.Status == StatusRunning {
		lead = "This call was approved and is running now. "
	}
	text := lead + s.Message + " Approval request handle: " + s.Handle + ". Follow it with the tool " + ToolApprovalStatus +
		` ({"handle": "` + s.Handle + `"}), at most every ` + fmt.Sprint(s.PollIntervalMs/1000) + " s. " + s.Next
	return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: text}},
		Meta: sdk.Meta{MetaAuthorization: envelope(RemediationAvailable, false), MetaApproval: s}}, nil
}

// approvalStatus is the approval_status tool: where the caller's approval
// request stands. A handle that is not the caller's is not found.
func (g *Gate) approvalStatus(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
	var in struct {
		Handle string `json:"handle"`
	}
	if err := json.Unmarshal(req.Params.Arguments, &in); err != nil || in.Handle == "" {
		return nil, rpcError(tasks.CodeInvalidParams, `approval_status needs {"handle": "..."}, the handle a tool call's result named`)
	}
	t, err := g.tasks.GetFor(ctx, in.Handle, tasks.PrincipalFrom(ctx))
	if errors.Is(err, tasks.ErrNotFound) || (err == nil && t.Kind != KindApproval) {
		return nil, rpcError(tasks.CodeInvalidParams, "no approval request of yours has this handle")
	}
	if err != nil {
		return nil, err
	}
	a, err := getApproval(ctx, g.cfg.DB, t.ID)
	if err != nil && !errors.Is(err, tasks.ErrNotFound) {
		return nil, err
	}
	s := g.state(t, a)
	text := "Approval request " + s.Handle + " for " + sanitize(s.Tool, 80) + ": " + s.Status + ". " + s.Message + " " + s.Next
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: text}}, StructuredContent: s}, nil
}
