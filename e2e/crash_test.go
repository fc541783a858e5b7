package e2e

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/mcp/tasks"
)

// TestCrashAtEachFaultPoint kills the MCP front-end with SIGKILL at each named
// point of a gated call's life, restarts it, and checks that the call still
// ends well: at most one execution in the ledger, exactly one backend request
// for the task, and none left pending without a live task.
func TestCrashAtEachFaultPoint(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{})
	ctx := context.Background()
	for i, tc := range []struct {
		point string
		// during says where the kill happens: in the tools/call itself, or
		// while executing after approval.
		duringCall  bool
		disposition string
		executions  int
	}{
		{"pep.after-intent", true, "approved-executed", 1},
		{"pep.after-submit", true, "approved-executed", 1},
		{"pep.after-handle", true, "approved-executed", 1},
		{"pep.after-claim", false, "outcome-unknown", 0},
		{"pep.after-invoke", false, "outcome-unknown", 1},
	} {
		t.Run(tc.point, func(t *testing.T) {
			s.mcp.cmd.Process.Kill()
			s.mcp.wait(10 * time.Second)
			s.mcp = s.startFaultyMCP(tc.point)
			alice := s.client(s.alice)
			args := map[string]any{"to": "acct-crash", "amount": 30000 + i}
			var taskID string
			if tc.duringCall {
				_, err := alice.CallTool(ctx, "wire_transfer", args, nil)
				require.Error(t, err, "the server dies inside tools/call")
				require.Equal(t, -1, s.mcp.wait(10*time.Second))
				s.mcp = s.startRecoveryMCP()
				alice = s.client(s.alice)
				// The agent retries the same call: it gets the task that the
				// restarted server recovered, not a second approval.
				var r *tasks.CallResult
				require.Eventually(t, func() bool {
					var err error
					r, err = alice.CallTool(ctx, "wire_transfer", args, nil)
					return err == nil
				}, 30*time.Second, 200*time.Millisecond)
				require.Equal(t, "task", r.ResultType)
				taskID = r.Task.TaskID
			} else {
				r, err := alice.CallTool(ctx, "wire_transfer", args, nil)
				require.NoError(t, err)
				taskID = r.Task.TaskID
			}
			var requests int
			require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*) FROM arap.requests WHERE resource->'properties'->'arguments'->>'amount' = $1`,
				fmtNum(30000+i)).Scan(&requests))
			require.Equal(t, 1, requests, "one intent, one backend request")

			require.Equal(t, 200, s.decide(s.requestOf(taskID), "approve"))
			if !tc.duringCall {
				require.Equal(t, -1, s.mcp.wait(60*time.Second), "killed at %s", tc.point)
				s.mcp = s.startMCP()
				alice = s.client(s.alice)
			}
			d := s.waitTask(alice, taskID)
			require.Equal(t, tasks.Completed, d.Status)
			_, m, _ := resultText(t, d)
			require.Equal(t, tc.disposition, m["io.modelcontextprotocol/tool-approval-disposition"])
			require.Equal(t, tc.executions, s.ledger(taskID), "never executed twice")
			// Nothing runs it again: not a callback, not its tracking job,
			// not the reconciler.
			s.nothingMoreRuns(map[string]int{taskID: tc.executions})
			var orphans int
			require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*) FROM arap.requests r WHERE r.status = 'pending'
				AND NOT EXISTS (SELECT 1 FROM pep.approval_tasks a WHERE a.backend_id = r.id AND a.phase <> 'done')`).Scan(&orphans))
			require.Zero(t, orphans, "no backend request is left pending without a live task")
		})
	}
}

func fmtNum(n int) string { return strconv.Itoa(n) }

// TestApproveCancelRace approves at the backend and cancels the task at the
// same moment, many times: a task is executed or cancelled, never both. Both
// outcomes must occur (a race that only ever went one way proves nothing
// about the other): at least 20 rounds, and more, up to 60, until the cancel
// and the claim have each won at least once.
func TestApproveCancelRace(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{})
	ctx := context.Background()
	alice := s.client(s.alice)
	outcomes := map[string]int{}
	executions := map[string]int{}
	bothSeen := func() bool { return outcomes[string(tasks.Cancelled)] > 0 && outcomes[string(tasks.Completed)] > 0 }
	var calls []time.Time // alice's calls in the last minute, within her 30 new requests a minute
	for i := 0; i < 60 && (i < 20 || !bothSeen()); i++ {
		if len(calls) >= 28 {
			time.Sleep(time.Until(calls[len(calls)-28].Add(61 * time.Second)))
		}
		calls = append(calls, time.Now())
		r, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-race", "amount": 40000 + i}, nil)
		require.NoError(t, err)
		require.NotNil(t, r.Task, "round %d: no task: %+v", i, r)
		id := s.requestOf(r.Task.TaskID)
		var wg sync.WaitGroup
		wg.Add(2)
		start := make(chan struct{})
		// One side starts a little after the other (the cancel in even
		// rounds, the approval in odd ones, by 0 to 160ms), so the cancel
		// lands anywhere from before the approval to after the claim.
		lag := time.Duration(i/2%5) * 40 * time.Millisecond
		approveAfter, cancelAfter := time.Duration(0), lag
		if i%2 == 1 {
			approveAfter, cancelAfter = lag, 0
		}
		go func() { defer wg.Done(); <-start; time.Sleep(approveAfter); s.decide(id, "approve") }()
		go func() { defer wg.Done(); <-start; time.Sleep(cancelAfter); _ = alice.Cancel(ctx, r.Task.TaskID) }()
		close(start)
		wg.Wait()
		d := s.waitTask(alice, r.Task.TaskID)
		executed := s.ledger(r.Task.TaskID)
		switch d.Status {
		case tasks.Cancelled:
			require.Zero(t, executed, "cancelled and executed")
		case tasks.Completed:
			_, m, _ := resultText(t, d)
			require.Equal(t, "approved-executed", m["io.modelcontextprotocol/tool-approval-disposition"])
			require.Equal(t, 1, executed)
		default:
			t.Fatalf("unexpected status %s", d.Status)
		}
		outcomes[string(d.Status)]++
		executions[r.Task.TaskID] = executed
	}
	// Nothing runs after the end: not the approval's callback, not a
	// tracking job, not the reconciler.
	s.nothingMoreRuns(executions)
	t.Logf("outcomes: %v", outcomes)
	require.True(t, bothSeen(), "the race never went both ways: %v", outcomes)
}
