package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
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
