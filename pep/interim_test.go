package pep_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
)

// interimMeta reads the next-step fields of a call's result.
func interimMeta(t *testing.T, raw json.RawMessage) map[string]any {
	t.Helper()
	var r struct {
		Meta map[string]any `json:"_meta"`
	}
	require.NoError(t, json.Unmarshal(raw, &r), "%s", raw)
	m, _ := r.Meta[pep.MetaApproval].(map[string]any)
	return m
}

// status calls approval_status as c and returns its structured answer.
func status(t *testing.T, c *tasks.Client, handle string) map[string]any {
	t.Helper()
	r, err := c.Call(context.Background(), "tools/call", pep.ToolApprovalStatus, map[string]any{"name": pep.ToolApprovalStatus, "arguments": map[string]any{"handle": handle}})
	require.NoError(t, err)
	require.Nil(t, r.Error, "%s", r.Raw)
	var res struct {
		Structured map[string]any `json:"structuredContent"`
		IsError    bool           `json:"isError"`
	}
	require.NoError(t, json.Unmarshal(r.Result, &res))
	require.False(t, res.IsError, "%s", r.Raw)
	return res.Structured
}

// TestApprovalToolsFinishWithoutTasks (issue 33): a client that does not
// drive tasks gets an approval-gated call approved and run. The call makes
// the request (the same task a tasks client gets, deferred) and answers
// with a handle; approval_status follows it; approved, the task waits for
// its caller; the same call again re-evaluates, claims and runs it once and
// returns its result; a further repeat is a new call with a new request.
func TestApprovalToolsFinishWithoutTasks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPEP(t, pepOptions{approvalTools: true})
	plain := &tasks.Client{URL: p.url, Token: aliceToken, NoTasks: true}
	tools, _, err := plain.ListTools(ctx)
	require.NoError(t, err)
	var names []string
	for _, tl := range tools {
		names = append(names, tl.Name)
	}
	require.Contains(t, names, pep.ToolApprovalStatus)

	args := map[string]any{"to": "acct-interim", "amount": 50500}
	r, err := plain.CallTool(ctx, "wire_transfer", args, nil)
	require.NoError(t, err)
	require.True(t, r.IsError, "not run: %s", r.Raw)
	m := interimMeta(t, r.Raw)
	require.Equal(t, pep.StatusPending, m["status"], "%s", r.Raw)
	handle := m["handle"].(string)
	require.Regexp(t, `^tsk_[A-Z2-7]{26}$`, handle, "the handle is the task's id and nothing else")
	require.Contains(t, string(r.Raw), pep.ToolApprovalStatus)
	require.NotContains(t, string(r.Raw), "binding_token")
	require.NotContains(t, string(r.Raw), "arq_", "no backend artifact")

	// The same call while pending: the same request, still pending.
	r, err = plain.CallTool(ctx, "wire_transfer", args, nil)
	require.NoError(t, err)
	require.Equal(t, handle, interimMeta(t, r.Raw)["handle"])
	require.Equal(t, pep.StatusPending, status(t, plain, handle)["status"])

	// Another principal does not see it.
	mallory := &tasks.Client{URL: p.url, Token: "mallory-token-01", NoTasks: true}
	require.NoError(t, p.gate.Callers().Create(ctx, "mallory-agent", "mallory-token-01", pep.Principal{SubjectType: "user", SubjectID: "mallory", ActorID: "agent:demo"}))
	res, err := mallory.Call(ctx, "tools/call", pep.ToolApprovalStatus, map[string]any{"name": pep.ToolApprovalStatus, "arguments": map[string]any{"handle": handle}})
	require.NoError(t, err)
	require.NotNil(t, res.Error, "%s", res.Raw)
	require.Contains(t, res.Error.Message, "no approval request of yours")

	// Approved: the look marks it approved and does not run it.
	p.approve(t, p.request(t, handle), time.Time{})
	p.advance(t, handle)
	st := status(t, plain, handle)
	require.Equal(t, pep.StatusApproved, st["status"], "%v", st)
	require.NotEmpty(t, st["approvedUntil"])
	require.Zero(t, p.ledger(t, handle), "approved, but not run before the caller asks")

	// The same call again: it runs, once, and the caller gets its result.
	r, err = plain.CallTool(ctx, "wire_transfer", args, nil)
	require.NoError(t, err)
	require.False(t, r.IsError, "%s", r.Raw)
	require.Contains(t, string(r.Raw), pep.ApprovedExecuted)
	require.Equal(t, 1, p.ledger(t, handle))
	require.Equal(t, pep.StatusCompleted, status(t, plain, handle)["status"])
	require.Equal(t, []string{pep.AuditClaimed, pep.AuditCompleted}, p.trail(t, handle), "the same claim and audit as a task")

	// Once more: a new call, with a new request; the first never runs again.
	r, err = plain.CallTool(ctx, "wire_transfer", args, nil)
	require.NoError(t, err)
	again := interimMeta(t, r.Raw)
	require.Equal(t, pep.StatusPending, again["status"])
	require.NotEqual(t, handle, again["handle"])
	require.Equal(t, 1, p.ledger(t, handle))

	// A changed call needs its own approval.
	r, err = plain.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-interim", "amount": 50501}, nil)
	require.NoError(t, err)
	require.NotEqual(t, handle, interimMeta(t, r.Raw)["handle"])
	p.requireIntact(t)
}

// TestApprovalToolsEndings: a denied request and an approval left unused
// past its approved_until end the request (denied, expired) and never run;
// a repeat then says so; a tasks client that repeats a deferred call takes
// the task over and it runs on its own.
func TestApprovalToolsEndings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPEP(t, pepOptions{approvalTools: true})
	plain := &tasks.Client{URL: p.url, Token: aliceToken, NoTasks: true}
	open := func(amount int) (string, map[string]any) {
		args := map[string]any{"to": "acct-end", "amount": amount}
		r, err := plain.CallTool(ctx, "wire_transfer", args, nil)
		require.NoError(t, err)
		return interimMeta(t, r.Raw)["handle"].(string), args
	}

	denied, _ := open(50601)
	code, out := p.backendAPI(t, dev.ITSMToken, "POST", "/v1/requests/"+p.request(t, denied)+"/decisions", map[string]any{"decision": "deny", "reason": "no"})
	require.Equal(t, 200, code, "%v", out)
	p.advance(t, denied)
	require.Equal(t, pep.StatusDenied, status(t, plain, denied)["status"])
	require.Zero(t, p.ledger(t, denied))

	unused, args := open(50602)
	until := time.Now().Add(2 * time.Minute).Truncate(time.Second)
	p.approve(t, p.request(t, unused), until)
	p.advance(t, unused)
	require.Equal(t, pep.StatusApproved, status(t, plain, unused)["status"])
	p.offset.Store(int64(3 * time.Minute)) // past approved_until, by the front-end's clock
	n, err := p.gate.LookDue(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	st := status(t, plain, unused)
	require.Equal(t, pep.StatusExpired, st["status"], "%v", st)
	require.Zero(t, p.ledger(t, unused))
	p.offset.Store(0)
	r, err := plain.CallTool(ctx, "wire_transfer", args, nil)
	require.NoError(t, err)
	require.NotEqual(t, unused, interimMeta(t, r.Raw)["handle"], "an ended request is never reopened: a new one is made")

	// A tasks client repeating a deferred call gets the task, which then
	// runs on its own when approved.
	taken, args := open(50603)
	r, err = p.alice.CallTool(ctx, "wire_transfer", args, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeTask, r.ResultType)
	require.Equal(t, taken, r.Task.TaskID)
	p.approve(t, p.request(t, taken), time.Time{})
	p.advance(t, taken)
	require.Equal(t, pep.ApprovedExecuted, disposition(t, p.task(t, taken)))
	require.Equal(t, 1, p.ledger(t, taken))
}
