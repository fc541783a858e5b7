package chaos

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func at(s int) time.Time         { return t0.Add(time.Duration(s) * time.Second) }
func ptr(t time.Time) *time.Time { return &t }

// good is a clean history: one executed pay call, one denied wire transfer,
// one allowed note, one denied tool refused.
func good() *History {
	return &History{
		Calls: []*Call{
			{ID: "p1", Tool: upstreamPfx + ToolPay, Kind: "gated", TaskID: "tsk_p1", Final: "completed", Disp: pep.ApprovedExecuted, Start: at(0), End: at(9),
				Attempts: []Attempt{{At: at(0), Method: "tools/call", Outcome: "lost"}, {At: at(1), Method: "tools/call", Outcome: "task", Detail: "tsk_p1"}}},
			{ID: "w1", Tool: "wire_transfer", Kind: "gated", TaskID: "tsk_w1", Final: "completed", Disp: pep.DeniedNotExecuted, Start: at(0), End: at(5),
				Attempts: []Attempt{{At: at(0), Method: "tools/call", Outcome: "task"}}},
			{ID: "n1", Tool: upstreamPfx + ToolNote, Kind: "allowed", Final: "result", Start: at(0), End: at(1),
				Attempts: []Attempt{{At: at(0), Method: "tools/call", Outcome: "result"}}},
			{ID: "f1", Tool: upstreamPfx + ToolForbidden, Kind: "denied", Final: "error-result", Start: at(0), End: at(1),
				Attempts: []Attempt{{At: at(0), Method: "tools/call", Outcome: "error-result"}}},
		},
		Tasks: []TaskRow{
			{ID: "tsk_p1", Status: "completed", Tool: upstreamPfx + ToolPay, Phase: "done", Disposition: pep.ApprovedExecuted, ClaimedAt: ptr(at(5)), BackendID: "arq_p1", CreatedAt: at(1), TerminalAt: ptr(at(6))},
			{ID: "tsk_w1", Status: "completed", Tool: "wire_transfer", Phase: "done", Disposition: pep.DeniedNotExecuted, BackendID: "arq_w1", CreatedAt: at(0), TerminalAt: ptr(at(5))},
		},
		Intents: []IntentRow{{Key: "k1", TaskID: "tsk_p1", State: "bound", BackendID: "arq_p1"}, {Key: "k2", TaskID: "tsk_w1", State: "bound", BackendID: "arq_w1"}},
		Requests: []RequestRow{
			{ID: "arq_p1", Status: "approved", CallID: "p1", HasCallback: true, Delivery: "delivered", AllowedSeq: 4, CreatedAt: at(1)},
			{ID: "arq_w1", Status: "denied", CallID: "w1", HasCallback: true, Delivery: "pending", Received: true, CreatedAt: at(0)},
		},
		Executions: []Execution{{CallID: "p1", Tool: ToolPay, At: at(5)}, {CallID: "n1", Tool: ToolNote, At: at(0)}},
		Settle:     SettleOutcome{Bound: time.Minute, At: at(60)},
	}
}

func properties(v []Violation) []string {
	var out []string
	for _, x := range v {
		out = append(out, x.Property)
	}
	return out
}

func TestCheckCleanHistory(t *testing.T) {
	require.Empty(t, Check(good()))
}

// TestCheckCatchesEachViolation breaks the clean history one way at a time
// (each a mutation of what arap might do) and requires the checker to name
// exactly that property.
func TestCheckCatchesEachViolation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(h *History)
		want   []string
	}{
		{"upstream tool ran twice for one task", func(h *History) {
			h.Executions = append(h.Executions, Execution{CallID: "p1", Tool: ToolPay, At: at(7)})
		}, []string{PropExecutedTwice}},
		{"demo tool ran twice (ledger)", func(h *History) {
			h.Ledger = append(h.Ledger, LedgerRow{TaskID: "tsk_x", Tool: "wire_transfer", At: at(3)}, LedgerRow{TaskID: "tsk_x", Tool: "wire_transfer", At: at(4)})
		}, []string{PropExecutedTwice}},
		{"denied task ran", func(h *History) {
			h.Ledger = append(h.Ledger, LedgerRow{TaskID: "tsk_w1", Tool: "wire_transfer", At: at(3)})
		}, []string{PropExecutedWhenEnded}},
		{"cancelled task ran", func(h *History) {
			h.Tasks[1].Status, h.Tasks[1].Disposition = "cancelled", ""
			h.Calls[1].Final, h.Calls[1].Disp = "cancelled", ""
			h.Requests[1].Status = "cancelled"
			h.Ledger = append(h.Ledger, LedgerRow{TaskID: "tsk_w1", Tool: "wire_transfer", At: at(3)})
		}, []string{PropExecutedWhenEnded}},
		{"expired request, task ran", func(h *History) {
			h.Tasks[1].Disposition = pep.ApprovedExecuted
			h.Calls[1].Disp = pep.ApprovedExecuted
			h.Requests[1].Status = "expired"
			h.Ledger = append(h.Ledger, LedgerRow{TaskID: "tsk_w1", Tool: "wire_transfer", At: at(3)})
		}, []string{PropExecutedWhenEnded}},
		{"revoked before the re-evaluation allowed, yet ran", func(h *History) {
			h.Requests[0].RevokedSeq, h.Requests[0].AllowedSeq = 4, 5
		}, []string{PropExecutedWhenEnded}},
		{"revoked after the re-evaluation had used the approval", func(h *History) {
			h.Requests[0].RevokedSeq = 5
		}, []string{PropRevokedAfterUse}},
		{"upstream ran without any claim", func(h *History) {
			h.Tasks[0].ClaimedAt = nil
			h.Tasks[0].Disposition = pep.DeniedNotExecuted
			h.Calls[0].Disp = pep.DeniedNotExecuted
		}, []string{PropApprovalDropped, PropExecutedWhenEnded}},
		{"an approved, unrevoked request's task ended denied", func(h *History) {
			h.Executions = h.Executions[1:]
			h.Tasks[0].Disposition, h.Tasks[0].ClaimedAt = pep.DeniedNotExecuted, nil
			h.Calls[0].Disp = pep.DeniedNotExecuted
		}, []string{PropApprovalDropped}},
		{"an allowed call answered unavailable ran anyway", func(h *History) {
			h.Calls[2].Attempts = append([]Attempt{{At: at(0), Method: "tools/call", Outcome: "unavailable"}}, h.Calls[2].Attempts...)
			h.Executions = append(h.Executions, Execution{CallID: "n1", Tool: ToolNote, At: at(0)})
		}, []string{PropExecutedTwice}},
		{"a direct demo-tool call ran twice (ledger)", func(h *History) {
			h.Calls = append(h.Calls, &Call{ID: "d1", Tool: "wire_transfer", Kind: "allowed", Final: "result", Start: at(0), End: at(2),
				Attempts: []Attempt{{At: at(0), Method: "tools/call", Outcome: "unavailable"}, {At: at(1), Method: "tools/call", Outcome: "result"}}})
			h.Ledger = append(h.Ledger, LedgerRow{Tool: "wire_transfer", CallID: "d1", At: at(0)}, LedgerRow{Tool: "wire_transfer", CallID: "d1", At: at(1)})
		}, []string{PropExecutedTwice}},
		{"the denied tool ran", func(h *History) {
			h.Executions = append(h.Executions, Execution{CallID: "f1", Tool: ToolForbidden, At: at(1)})
		}, []string{PropDeniedToolExecuted}},
		{"an allowed call ran more often than it was sent", func(h *History) {
			h.Executions = append(h.Executions, Execution{CallID: "n1", Tool: ToolNote, At: at(1)})
		}, []string{PropExecutedTwice}},
		{"task not terminal", func(h *History) {
			h.Tasks[1].Status, h.Tasks[1].Disposition = "working", ""
			h.Requests[1].Status = "pending"
			h.Calls[1].Final = "working"
		}, []string{PropTaskNotTerminal}},
		{"pending request no live task tracks", func(h *History) {
			h.Requests = append(h.Requests, RequestRow{ID: "arq_orphan", Status: "pending", CreatedAt: at(2)})
		}, []string{PropRequestUntracked}},
		{"intent without outcome", func(h *History) {
			h.Intents = append(h.Intents, IntentRow{Key: "k3", TaskID: "tsk_w1", State: "intent"})
		}, []string{PropIntentWithout}},
		{"approved-executed without a side effect", func(h *History) {
			h.Executions = h.Executions[1:]
		}, []string{PropDispositionMismatch}},
		{"outcome-unknown without a claim", func(h *History) {
			h.Tasks[1].Disposition = pep.OutcomeUnknown
			h.Calls[1].Disp = pep.OutcomeUnknown
		}, []string{PropDispositionMismatch}},
		{"client told something else than the table", func(h *History) {
			h.Calls[1].Disp = pep.ApprovedExecuted
		}, []string{PropClientDisagrees}},
		{"audit chain break", func(h *History) {
			h.Audit.PEPBreaks = []string{"tsk_p1 seq 2: hash mismatch"}
		}, []string{PropAuditBreak}},
		{"callback never reached the receiver", func(h *History) {
			h.Requests[1].Received = false
			h.Requests[1].Delivery = "failed"
		}, []string{PropCallbackMissing}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := good()
			tc.mutate(h)
			v := Check(h)
			require.Equal(t, tc.want, properties(v), "%+v", v)
			require.NotEmpty(t, v[0].Subject)
		})
	}
}

// TestCheckAllowsWhatMayHappen: what faults may legitimately cause is not a
// violation.
func TestCheckAllowsWhatMayHappen(t *testing.T) {
	t.Run("outcome-unknown after a claim, run or not", func(t *testing.T) {
		h := good()
		h.Tasks[0].Disposition = pep.OutcomeUnknown
		h.Calls[0].Disp = pep.OutcomeUnknown
		require.Empty(t, Check(h))
		h.Executions = h.Executions[1:]
		require.Empty(t, Check(h))
	})
	t.Run("a retry after the first task ended opens a second task that runs", func(t *testing.T) {
		h := good()
		h.Tasks = append(h.Tasks, TaskRow{ID: "tsk_p2", Status: "completed", Tool: upstreamPfx + ToolPay, Phase: "done", Disposition: pep.ApprovedExecuted,
			ClaimedAt: ptr(at(20)), BackendID: "arq_p2", CreatedAt: at(15)})
		h.Requests = append(h.Requests, RequestRow{ID: "arq_p2", Status: "approved", CallID: "p1", HasCallback: true, Delivery: "delivered", AllowedSeq: 4})
		h.Executions = append(h.Executions, Execution{CallID: "p1", Tool: ToolPay, At: at(20)})
		require.Empty(t, Check(h))
	})
	t.Run("a callback retry scheduled after the settle", func(t *testing.T) {
		h := good()
		h.Requests[1].Received = false
		h.Requests[1].NextAttempt = ptr(at(300))
		require.Empty(t, Check(h))
	})
}

// TestMinimalHistory: a violation carries the records of its call, task and
// request, and the faults active meanwhile, in time order.
func TestMinimalHistory(t *testing.T) {
	h := good()
	h.Executions = append(h.Executions, Execution{CallID: "p1", Tool: ToolPay, At: at(7)})
	h.Faults = []Fault{{Kind: FaultKill, Target: "mcp-1", Start: at(5), End: at(6)}, {Kind: FaultKill, Target: "mcp-2", Start: at(100), End: at(101)}}
	h.Decisions = []Decision{{At: at(3), Request: "arq_p1", Action: "approve", Status: 200}}
	v := Check(h)
	require.Len(t, v, 1)
	var whats []string
	for i, e := range v[0].History {
		if i > 0 {
			require.False(t, e.At.Before(v[0].History[i-1].At), "time order")
		}
		whats = append(whats, e.What)
	}
	require.Contains(t, whats, "upstream ran pay for call p1")
	require.Contains(t, whats, "approver: approve arq_p1 -> HTTP 200")
	require.Contains(t, whats, "fault kill-9 on mcp-1 until 12:00:06.000")
	for _, w := range whats {
		require.NotContains(t, w, "mcp-2", "a fault outside the call's span is left out")
		require.NotContains(t, w, "w1", "other calls are left out")
	}
}

func TestScheduleIsReproducible(t *testing.T) {
	procs, proxies := []string{"serve-1", "mcp-1"}, []string{"db:serve-1", "client:1"}
	a := schedule(7, 200, time.Minute, procs, proxies)
	require.Equal(t, a, schedule(7, 200, time.Minute, procs, proxies))
	require.NotEqual(t, a, schedule(8, 200, time.Minute, procs, proxies))
	require.Len(t, a, 200)
	kinds := map[string]int{}
	for i, p := range a {
		kinds[p.Kind]++
		require.Less(t, p.At, time.Minute)
		if i > 0 {
			require.GreaterOrEqual(t, p.At, a[i-1].At-time.Minute/200, "spread over the duration")
		}
	}
	for _, k := range []string{FaultKill, FaultPGFast, FaultPGCrash, FaultLatency, FaultStall, FaultReset, FaultCut} {
		require.Positive(t, kinds[k], "%s drawn", k)
	}
}

func TestRetryable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
		kind string
	}{
		{&tasksRPCError{HTTPStatus: 200, Code: -31001}, true, "unavailable"},
		{&tasksRPCError{HTTPStatus: 503, Code: -31001}, true, "unavailable"},
		{&tasksRPCError{HTTPStatus: 503, Code: -32000}, true, "unavailable"},
		{&tasksRPCError{HTTPStatus: 500, Code: -32000}, true, "internal"},
		{&tasksRPCError{HTTPStatus: 200, Code: -32603}, true, "internal"},
		{&tasksRPCError{HTTPStatus: 200, Code: -32602}, false, "error"},
		{&tasksRPCError{HTTPStatus: 200, Code: 0, Message: "failed to connect to database"}, true, "internal"},
		{errLost, true, "lost"},
	} {
		got, kind := retryable(tc.err)
		require.Equal(t, tc.want, got, "%v", tc.err)
		require.Equal(t, tc.kind, kind, "%v", tc.err)
	}
}

type tasksRPCError = tasks.RPCError

var errLost = errors.New("Post: connection reset by peer")

// TestFailures: a run fails on a violation, on a task unsettled at the
// bound, and, with the points armed, on no outcome-unknown ending at all.
func TestFailures(t *testing.T) {
	h := good()
	h.Tasks = append(h.Tasks, TaskRow{ID: "tsk_u", Status: "completed", Disposition: pep.OutcomeUnknown, ClaimedAt: ptr(at(3))})
	require.Empty(t, Summarize(h, nil, nil).Failures(h, true))
	require.Len(t, Summarize(h, []Violation{{Property: PropExecutedTwice}}, nil).Failures(h, true), 1)
	h.Settle.Unsettled = []string{"tsk_w1"}
	require.Len(t, Summarize(h, nil, nil).Failures(h, true), 1)

	h = good()
	require.Equal(t, []string{"no task ended outcome-unknown: the execution claim's windows were not exercised"}, Summarize(h, nil, nil).Failures(h, true))
	require.Empty(t, Summarize(h, nil, nil).Failures(h, false), "unarmed points need not produce one")
}
