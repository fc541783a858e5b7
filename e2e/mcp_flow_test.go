package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
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
    request_schema: &ticket
      type: object
      required: [context]
      properties:
        context:
          type: object
          required: [ticket]
          properties:
            ticket: {type: string, pattern: "^CHG[0-9]+$", description: "Change ticket, e.g. CHG123"}
  # The revocation must land before the grant: a delay that no stall of a
  # loaded machine between two HTTP calls comes near.
  - name: provision_slowly
    match: {resource_id: wire_transfer}
    when: resource.properties.arguments.amount == 23
    effect: request
    approval: {kinds: [itsm], grant_delay: 10s}
    request_schema: *ticket
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
	t.Parallel()
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
		id := r.Task.TaskID
		first := lookAt(t, s, id) // the binding's: the safety poll (pep.SafetyPoll)
		require.NotNil(t, first)
		require.Equal(t, 200, s.decide(s.requestOf(id), "approve"))
		// The callback wakes the task; re-evaluation says retry (the grant
		// is still provisioning), which leaves the task working and moves
		// its next look to the retry-after, sooner than the safety poll.
		require.Eventually(t, func() bool {
			at := lookAt(t, s, id)
			return at != nil && at.Before(*first)
		}, 60*time.Second, 50*time.Millisecond, "no sooner look after the callback")
		d, _, err := alice.Get(ctx, id)
		require.NoError(t, err)
		if d.Status != tasks.Working { // the sooner look may have run already
			disp, _ := disposition(t, d)
			require.Equal(t, "approved-executed", disp, "retry keeps the task working; never a denial")
		}
		d = s.waitTask(alice, id)
		disp, _ := disposition(t, d)
		require.Equal(t, "approved-executed", disp)
		require.Equal(t, 1, s.ledger(id))
		// It was that sooner look that ran it, not the safety poll: the
		// task ended before its first look was due.
		var ended time.Time
		require.NoError(t, s.pool.QueryRow(ctx, `SELECT terminal_at FROM pep.tasks WHERE id = $1`, id).Scan(&ended))
		require.True(t, ended.Before(*first), "the safety poll ended the task (ended %s, first look %s)", ended, *first)
	})

	t.Run("a revoked approval opens a new request, with input asked in-task", func(t *testing.T) {
		r := answer(t, alice, map[string]any{"to": "c", "amount": 23}, "CHG200")
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
		s.nothingMoreRuns(map[string]int{r.Task.TaskID: 1})
	})

	t.Run("a policy that denies at re-evaluation ends the task denied", func(t *testing.T) {
		r, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "d", "amount": 30000}, nil)
		require.NoError(t, err)
		arapctl(t, s.env, "attributes", "set", "lockdown", "true")
		// Attribute caches are at most a second old: wait until the
		// backend's evaluations see the lockdown.
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			req, err := requestable(s, map[string]any{"to": "d", "amount": 30000})
			require.NoError(c, err)
			assert.False(c, req, "the backend does not see the lockdown yet")
		}, 30*time.Second, 100*time.Millisecond)
		require.Equal(t, 200, s.decide(s.requestOf(r.Task.TaskID), "approve"))
		d := s.waitTask(alice, r.Task.TaskID)
		disp, text := disposition(t, d)
		require.Equal(t, "denied-not-executed", disp)
		require.Contains(t, text, "policy")
		require.Zero(t, s.ledger(r.Task.TaskID))
		arapctl(t, s.env, "attributes", "unset", "lockdown")
	})
}

// lookAt is when the front-end next looks at the task (nil: not set).
func lookAt(t *testing.T, s *stack, taskID string) *time.Time {
	var at *time.Time
	if err := s.pool.QueryRow(context.Background(), `SELECT look_at FROM pep.approval_tasks WHERE task_id = $1`, taskID).Scan(&at); err != nil {
		t.Errorf("look of %s: %v", taskID, err) // not require: this may run on Eventually's goroutine
	}
	return at
}

// requestable reports whether the backend's PDP answers the call with a
// requestable denial.
func requestable(s *stack, args map[string]any) (bool, error) {
	b, err := json.Marshal(toolCall("wire_transfer", args))
	if err != nil {
		return false, err
	}
	req, err := http.NewRequest("POST", s.api+"/access/v1/evaluation", bytes.NewReader(b))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+s.pepToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("evaluation: HTTP %d", resp.StatusCode)
	}
	var d authzen.Decision
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		return false, err
	}
	_, ok := d.AccessRequest()
	return !d.Decision && ok, nil
}
