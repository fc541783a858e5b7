package pep

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5"

	"github.com/omcp/arap/internal/schemamsg"
	"github.com/omcp/arap/mcp/tasks"
)

// The approval task as a tasks.Kind: what tasks/cancel and tasks/update do
// to it. The task store (mcp/tasks) checks ownership and status first.

// KindApproval is the task kind of approval tasks.
const KindApproval = "tool-approval"

var _ tasks.Kind = (*Gate)(nil)

// Cancel implements tasks.Kind: the same compare-and-set as the claim, from
// a cancellable pre-claim phase to cancelled. If it wins, the tool can never
// run and the backend request is cancelled; if the claim won, it is a no-op.
func (g *Gate) Cancel(ctx context.Context, t *tasks.Task) error {
	if brokenBuild && broken(violateCancelIgnored) {
		return nil
	}
	if brokenBuild && broken(violateExecuteAfterCancel) { // reports cancelled, fences nothing, cancels no request
		return pgx.BeginFunc(ctx, g.cfg.DB, func(tx pgx.Tx) error {
			_, err := g.tasks.TransitionTx(ctx, tx, t.ID, tasks.Change{To: tasks.Cancelled, StatusMessage: "Cancelled by the client; the tool did not run."})
			return err
		})
	}
	a, won, err := g.cancelLocalWon(ctx, t.ID, "Cancelled by the client; the tool did not run.", t.Principal)
	if err != nil || !won {
		return err
	}
	if a.CancelURL != nil {
		g.cancelBackend(ctx, *a.CancelURL)
	}
	return nil
}

// Update implements tasks.Kind: answers to the in-task input a chained
// request needs (asked for by chain, in advance.go). They are validated
// against the backend's request schema; then the call is evaluated afresh
// and the new request submitted, the answer's key marked answered in the
// same transaction as the task's move (a crash between the two would leave
// the question outstanding with its answer ignored for ever). An answer
// after the input's deadline ends the task, expired: the answer never
// leads back to the same question.
func (g *Gate) Update(ctx context.Context, t *tasks.Task, responses map[string]json.RawMessage) error {
	a, err := getApproval(ctx, g.cfg.DB, t.ID)
	if err != nil {
		return err
	}
	if a.Phase != phaseInput {
		return nil // moved on meanwhile: the answer is no longer outstanding
	}
	if a.Deadline == nil || !g.now().Before(*a.Deadline) {
		return g.deny(ctx, a, msgInputExpired) // its result says why
	}
	var key string
	var raw json.RawMessage
	for k, v := range responses {
		key, raw = k, v
	}
	var ans struct {
		Action  string         `json:"action"`
		Content map[string]any `json:"content"`
	}
	if json.Unmarshal(raw, &ans) != nil {
		return &tasks.InputError{Msg: "inputResponses[" + key + "] must be an elicitation result"}
	}
	if ans.Action != "accept" {
		return g.deny(ctx, a, "The information needed for a new approval was declined; the tool did not run.")
	}
	if v := validateAnswers(a.InputSchema, ans.Content); len(v) > 0 {
		return &tasks.InputError{Msg: "the answer does not satisfy the request schema: " + schemamsg.Join(v)}
	}
	b, err := g.binding(a)
	if err != nil {
		return g.fail(ctx, a, "the stored call binding is damaged")
	}
	tool, why, err := g.current(a, b)
	if err != nil {
		return err
	}
	if why != "" {
		return g.deny(ctx, a, why)
	}
	d, err := g.cfg.Backend.Evaluate(ctx, evaluation(b.Principal, &tool.Tool, b.Args))
	if err != nil {
		return err
	}
	hint, ok := d.AccessRequest()
	if d.Decision || !ok {
		return g.deny(ctx, a, "The policy changed while waiting for input; call the tool again. It did not run.")
	}
	return g.reopen(ctx, a, tool, b, d, hint, ans.Content, phaseInput, key)
}
