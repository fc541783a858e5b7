package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/mcp"
	"github.com/omcp/arap/mcp/tasks"
)

const flowPolicy = `version: 1
rules:
  - name: lockdown
    when: has(attributes.lockdown) && attributes.lockdown == true
    effect: deny
  - name: quick
    match: {resource_id: wire_transfer}
    when: resource.properties.arguments.amount == 11
    effect: request
    request_ttl: 2s
    approval: {kinds: [itsm]}
  - name: provision
    match: {resource_id: wire_transfer}
    when: resource.properties.arguments.amount == 22
    effect: request
    approval: {kinds: [itsm], grant_delay: 3s}
    request_schema:
      type: object
      required: [context]
      properties:
        context:
          type: object
          required: [ticket]
          properties:
            ticket: {type: string, pattern: "^CHG[0-9]+$", description: "Change ticket, e.g. CHG123"}
  - name: wire_transfer_large
    match: {resource_id: wire_transfer}
    effect: request
    approval: {kinds: [itsm]}
`

// answer runs the MRTR round of a call whose backend schema wants a ticket.
func answer(t *testing.T, c *tasks.Client, args map[string]any, ticket string) *tasks.CallResult {
	t.Helper()
	ctx := context.Background()
	r, err := c.CallTool(ctx, "wire_transfer", args, nil)
	require.NoError(t, err)
	require.Equal(t, "input_required", r.ResultType)
	var key string
	for k := range r.InputRequests {
		key = k
	}
	r, err = c.CallTool(ctx, "wire_transfer", args, map[string]any{"requestState": r.RequestState,
		"inputResponses": map[string]any{key: map[string]any{"action": "accept", "content": map[string]any{"ticket": ticket}}}})
	require.NoError(t, err)
	require.Equal(t, "task", r.ResultType)
	return r
}

func disposition(t *testing.T, d *tasks.Detailed) (string, string) {
	text, m, _ := resultText(t, d)
	s, _ := m["io.modelcontextprotocol/tool-approval-disposition"].(string)
	return s, text
}

func TestApprovalFlows(t *testing.T) {
	s := newStack(t, stackOptions{policy: flowPolicy})
	ctx := context.Background()
	alice := s.client(s.alice)

	t.Run("an expired request ends denied and can never run", func(t *testing.T) {
		r, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "a", "amount": 11}, nil)
		require.NoError(t, err)
		backendID := s.requestOf(r.Task.TaskID)
		d := s.waitTask(alice, r.Task.TaskID)
		require.Equal(t, tasks.Completed, d.Status)
		disp, text := disposition(t, d)
		require.Equal(t, "denied-not-executed", disp)
		require.Contains(t, text, "expired")
		require.Equal(t, 409, s.decide(backendID, "approve"), "a late approval is refused")
		require.Zero(t, s.ledger(r.Task.TaskID))
	})

	t.Run("grant pending: the task waits and then runs once", func(t *testing.T) {
		r := answer(t, alice, map[string]any{"to": "b", "amount": 22}, "CHG100")
		require.Equal(t, 200, s.decide(s.requestOf(r.Task.TaskID), "approve"))
		time.Sleep(1200 * time.Millisecond)
		d, _, err := alice.Get(ctx, r.Task.TaskID)
		require.NoError(t, err)
		require.Equal(t, tasks.Working, d.Status, "retry keeps the task working; never a denial")
		// The callback's follow-up looks again at the retry-after, well
		// before the 30 s safety poll would.
		d = s.waitTaskWithin(alice, r.Task.TaskID, mcp.SafetyPoll*2/3)
		disp, _ := disposition(t, d)
		require.Equal(t, "approved-executed", disp)
		require.Equal(t, 1, s.ledger(r.Task.TaskID))
	})

	t.Run("a revoked approval opens a new request, with input asked in-task", func(t *testing.T) {
		r := answer(t, alice, map[string]any{"to": "c", "amount": 22}, "CHG200")
		first := s.requestOf(r.Task.TaskID)
		require.Equal(t, 200, s.decide(first, "approve"))
		// While the grant is pending, revoke the approval.
		status, _ := postJSON(t, s.api+"/v1/approvals/"+first+"/revoke", s.itsmToken, map[string]any{"reason": "wrong ticket"})
		require.Equal(t, 200, status)
		d := s.waitTask(alice, r.Task.TaskID)
		require.Equal(t, tasks.InputRequired, d.Status, "re-evaluation said request; the new request needs a ticket")
		require.Len(t, d.InputRequests, 1)
		var key string
		for k := range d.InputRequests {
			key = k
		}
		// A bad answer is refused against the backend's schema; the key stays open.
		err := alice.Update(ctx, r.Task.TaskID, map[string]any{key: map[string]any{"action": "accept", "content": map[string]any{"ticket": "nope"}}})
		requireRPC(t, err, -32602, "request schema")
		// An unknown key is ignored.
		require.NoError(t, alice.Update(ctx, r.Task.TaskID, map[string]any{"other": map[string]any{"action": "accept"}}))
		d, _, err = alice.Get(ctx, r.Task.TaskID)
		require.NoError(t, err)
		require.Equal(t, tasks.InputRequired, d.Status)
		require.NoError(t, alice.Update(ctx, r.Task.TaskID, map[string]any{key: map[string]any{"action": "accept", "content": map[string]any{"ticket": "CHG201"}}}))
		var second string
		require.Eventually(t, func() bool { second = s.requestOf(r.Task.TaskID); return second != first }, 30*time.Second, 50*time.Millisecond)
		require.Equal(t, 200, s.decide(second, "approve"))
		d = s.waitTask(alice, r.Task.TaskID)
		disp, _ := disposition(t, d)
		require.Equal(t, "approved-executed", disp)
		require.Equal(t, 1, s.ledger(r.Task.TaskID))
		var gens int
		require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*) FROM pep.intents WHERE task_id = $1`, r.Task.TaskID).Scan(&gens))
		require.Equal(t, 2, gens, "two generations, each with its own key")
		// A late callback or poll for the first, consumed generation does nothing.
		require.Equal(t, 1, s.ledger(r.Task.TaskID))
	})

	t.Run("a policy that denies at re-evaluation ends the task denied", func(t *testing.T) {
		r, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "d", "amount": 30000}, nil)
		require.NoError(t, err)
		arapctl(t, s.env, "attributes", "set", "lockdown", "true")
		time.Sleep(1100 * time.Millisecond) // attribute caches are at most a second old
		require.Equal(t, 200, s.decide(s.requestOf(r.Task.TaskID), "approve"))
		d := s.waitTask(alice, r.Task.TaskID)
		disp, text := disposition(t, d)
		require.Equal(t, "denied-not-executed", disp)
		require.Contains(t, text, "policy")
		require.Zero(t, s.ledger(r.Task.TaskID))
		arapctl(t, s.env, "attributes", "unset", "lockdown")
	})
}
