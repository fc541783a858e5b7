package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/mcp/tasks"
)

// TestRevocationRacesAnApprovedTask (issue 40): each task's request is
// approved and its approval revoked straight after, racing the callback's
// re-evaluation and claim, at a spread of delays. Whichever comes first,
// the revoker is told the truth: 200, and the tool never runs with that
// approval (the re-evaluation refuses it and the task moves on to a new
// request); 409 approval_already_used, and the call the re-evaluation
// allowed runs once.
func TestRevocationRacesAnApprovedTask(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{policy: flowPolicy})
	ctx := context.Background()
	alice := s.client(s.alice)
	const n = 10
	type race struct {
		task, first string
		revoke      int
		problem     map[string]any
	}
	races := make([]race, n)
	for i := range races {
		r, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "race", "amount": 30000 + i}, nil)
		require.NoError(t, err)
		races[i].task = r.Task.TaskID
		races[i].first = s.requestOf(r.Task.TaskID)
	}
	for i := range races {
		require.Equal(t, 200, s.decide(races[i].first, "approve"))
		// Spread the revocations over the window in which the callback
		// arrives and the task re-evaluates: the order is the point.
		time.Sleep(time.Duration(i) * 15 * time.Millisecond)
		races[i].revoke, races[i].problem = postJSON(t, s.api+"/v1/approvals/"+races[i].first+"/revoke", s.itsmToken, map[string]any{"reason": "race"})
	}
	executed := map[string]int{}
	outcomes := map[int]int{}
	for _, r := range races {
		outcomes[r.revoke]++
		switch r.revoke {
		case 200:
			// Revoked first: the re-evaluation refuses the approval and
			// the task asks for a new one; the tool has not run.
			require.Eventually(t, func() bool {
				var current *string
				err := s.pool.QueryRow(ctx, `SELECT backend_id FROM pep.approval_tasks WHERE task_id = $1`, r.task).Scan(&current)
				return err == nil && current != nil && *current != r.first
			}, 60*time.Second, 20*time.Millisecond, "task %s never moved on from its revoked approval", r.task)
			require.Zero(t, s.ledger(r.task), "task %s ran although its approval's revocation was acknowledged", r.task)
			require.NoError(t, alice.Cancel(ctx, r.task))
			executed[r.task] = 0
		case 409:
			require.Equal(t, authzen.ProblemType(authzen.ProblemApprovalAlreadyUsed), r.problem["type"], "%v", r.problem)
			d := s.waitTask(alice, r.task)
			disp, _ := disposition(t, d)
			require.Equal(t, "approved-executed", disp)
			require.Equal(t, 1, s.ledger(r.task))
			executed[r.task] = 1
		default:
			t.Fatalf("revocation of %s answered %d: %v", r.first, r.revoke, r.problem)
		}
	}
	t.Logf("revocations: %v (200: revoked before use; 409: already used)", outcomes)
	s.nothingMoreRuns(executed)
}

// ticketFaultPolicy: a request needs a change ticket (asked in-task for a
// chained request), its denial good for 8 s; the grant takes 10 s, so a
// revocation made after the approval always lands before the approval is
// used.
const ticketFaultPolicy = `version: 1
rules:
  - name: ticketed
    match: {resource_id: wire_transfer}
    effect: request
    denial_ttl: 8s
    approval: {kinds: [itsm], grant_delay: 10s}
    request_schema:
      type: object
      required: [context]
      properties:
        context:
          type: object
          required: [ticket]
          properties:
            ticket: {type: string, pattern: "^CHG[0-9]+$"}
`

// TestUnansweredInputEndsAfterACrash (issue 41): a task whose approval was
// revoked asks in-task for what a new request needs, and its front-end is
// killed as the question commits. Nothing but the task's look waits for
// the answer, and the look is set in the ask's own UPDATE: a new
// front-end, with no client ever answering, ends the task at the input's
// deadline (denied-not-executed, the body saying it expired), and an
// answer after that changes nothing.
func TestUnansweredInputEndsAfterACrash(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{policy: ticketFaultPolicy, mcpEnv: []string{"ARAP_FAULT=pep.after-ask"}})
	ctx := context.Background()
	alice := s.client(s.alice)
	r := answer(t, alice, map[string]any{"to": "crash", "amount": 50000}, "CHG1")
	id := r.Task.TaskID
	first := s.requestOf(id)
	require.Equal(t, 200, s.decide(first, "approve"))
	status, body := postJSON(t, s.api+"/v1/approvals/"+first+"/revoke", s.itsmToken, map[string]any{"reason": "wrong ticket"})
	require.Equal(t, 200, status, "revoked during the grant's delay, before any use: %v", body)
	// At the grant, the look re-evaluates, the approval is refused, and the
	// task asks for a ticket: the process dies as that commits.
	require.Equal(t, -1, s.mcp.wait(60*time.Second), "killed at pep.after-ask")
	var phase string
	var deadline, look time.Time
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT phase, deadline, look_at FROM pep.approval_tasks WHERE task_id = $1`, id).Scan(&phase, &deadline, &look))
	require.Equal(t, "input", phase)
	require.Equal(t, deadline, look, "the look that ends the task committed with the question")

	s.mcp = s.startMCP()
	var d *tasks.Detailed
	require.Eventually(t, func() bool {
		got, _, err := alice.Get(ctx, id)
		if err == nil && got.Status.Terminal() {
			d = got
		}
		return d != nil
	}, 60*time.Second, 100*time.Millisecond, "the unanswered task never ended")
	require.Equal(t, "completed", string(d.Status))
	disp, text := disposition(t, d)
	require.Equal(t, "denied-not-executed", disp)
	require.Contains(t, text, "expired")
	var ended time.Time
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT terminal_at FROM pep.tasks WHERE id = $1`, id).Scan(&ended))
	require.False(t, ended.Before(deadline), "not before its deadline")
	var key string
	for k := range d.InputRequests {
		key = k
	}
	require.NoError(t, alice.Update(ctx, id, map[string]any{key: map[string]any{"action": "accept", "content": map[string]any{"ticket": "CHG2"}}}))
	d, _, err := alice.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, "completed", string(d.Status), "an answer after the end changes nothing")
	require.Zero(t, s.ledger(id))
}
