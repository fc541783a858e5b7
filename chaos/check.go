package chaos

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/omcp/arap/pep"
)

// Violation is one property the history breaks, with the minimal history
// that shows it: the records touching that call, task or request, in time
// order.
type Violation struct {
	Property string  `json:"property"`
	Subject  string  `json:"subject"`
	Detail   string  `json:"detail"`
	History  []Event `json:"history,omitempty"`
}

// Event is one line of a minimal history.
type Event struct {
	At   time.Time `json:"at"`
	What string    `json:"what"`
}

// Properties the checker judges (Violation.Property).
const (
	PropExecutedTwice       = "executed-twice"
	PropExecutedWhenEnded   = "executed-without-approval" // denied, cancelled, expired, revoked or never approved, yet ran
	PropDeniedToolExecuted  = "denied-tool-executed"
	PropTaskNotTerminal     = "task-not-terminal"
	PropRequestUntracked    = "request-not-terminal-nor-tracked"
	PropIntentWithout       = "intent-without-outcome"
	PropDispositionMismatch = "disposition-disagrees"
	PropApprovalDropped     = "approved-yet-denied" // its request approved and never revoked, the task ended denied-not-executed
	PropClientDisagrees     = "client-disagrees"
	PropAuditBreak          = "audit-chain-break"
	PropCallbackMissing     = "callback-not-delivered"
	PropRevokedAfterUse     = "revoked-after-use" // a revocation acknowledged for an approval a re-evaluation had already used
)

var terminalTask = map[string]bool{"completed": true, "failed": true, "cancelled": true}

// Check judges a history. It is pure: everything it needs is in h.
func Check(h *History) []Violation {
	ix := index(h)
	var out []Violation
	add := func(prop, subject, detail string, calls []string, tasks []string, reqs []string) {
		out = append(out, Violation{Property: prop, Subject: subject, Detail: detail, History: ix.minimal(calls, tasks, reqs)})
	}

	// Upstream side effects, judged from the upstream's own record.
	execs := map[string][]Execution{}
	for _, e := range h.Executions {
		execs[e.Tool+"\x00"+e.CallID] = append(execs[e.Tool+"\x00"+e.CallID], e)
	}
	for key, es := range execs {
		tool, callID, _ := strings.Cut(key, "\x00")
		switch tool {
		case ToolForbidden:
			add(PropDeniedToolExecuted, callID, fmt.Sprintf("the denied tool %s ran %d time(s)", tool, len(es)), []string{callID}, nil, nil)
		case ToolNote:
			// Allowed: arap forwards each attempt of the client at most once,
			// and none it answered "unavailable" (which says it did not run).
			if c := ix.calls[callID]; c != nil && len(es) > c.mayHaveRun() {
				add(PropExecutedTwice, callID, fmt.Sprintf("allowed call ran %d times for %d attempts that may have run it", len(es), c.mayHaveRun()), []string{callID}, nil, nil)
			}
		case ToolPay:
			tasks := ix.tasksOfCall(callID)
			var claimed []string
			for _, t := range tasks {
				if ix.tasks[t].ClaimedAt != nil {
					claimed = append(claimed, t)
				}
			}
			if len(es) > len(claimed) {
				prop := PropExecutedTwice
				if len(claimed) == 0 {
					prop = PropExecutedWhenEnded
				}
				add(prop, callID, fmt.Sprintf("ran %d time(s); tasks with an execution claim: %d of %d", len(es), len(claimed), len(tasks)), []string{callID}, tasks, nil)
			}
		}
	}
	ledger, direct := map[string]int{}, map[string]int{}
	for _, l := range h.Ledger {
		if l.TaskID != "" {
			ledger[l.TaskID]++
		} else if l.CallID != "" {
			direct[l.CallID]++
		}
	}
	// A direct (allowed) run of a demo tool: at most one per attempt that
	// may have run it.
	for callID, n := range direct {
		if c := ix.calls[callID]; c != nil && n > c.mayHaveRun() {
			add(PropExecutedTwice, callID, fmt.Sprintf("allowed call ran %d times (pep.ledger) for %d attempts that may have run it", n, c.mayHaveRun()), []string{callID}, nil, nil)
		}
	}
	for id, n := range ledger {
		if n > 1 {
			add(PropExecutedTwice, id, fmt.Sprintf("task's tool ran %d times (pep.ledger)", n), nil, []string{id}, nil)
		}
	}

	for _, t := range h.Tasks {
		executed := ledger[t.ID] > 0 || (t.Tool == upstreamPfx+ToolPay && len(execs[ToolPay+"\x00"+ix.callOfTask(t.ID)]) > 0)
		ledgerTool := t.Tool != upstreamPfx+ToolPay
		// An execution (ledger row, or the claim that an upstream run needs)
		// only on a task whose request was approved and not revoked first.
		if (ledgerTool && ledger[t.ID] > 0) || (!ledgerTool && t.ClaimedAt != nil && executed) {
			r := ix.reqs[t.BackendID]
			switch {
			case t.Disposition == pep.DeniedNotExecuted || t.Status == "cancelled":
				add(PropExecutedWhenEnded, t.ID, fmt.Sprintf("ran, yet ended %s/%s", t.Status, t.Disposition), nil, []string{t.ID}, []string{t.BackendID})
			case r == nil || r.Status != "approved":
				st := "missing"
				if r != nil {
					st = r.Status
				}
				add(PropExecutedWhenEnded, t.ID, "ran, yet its request is "+st, nil, []string{t.ID}, []string{t.BackendID})
			case r.RevokedSeq > 0 && (r.AllowedSeq == 0 || r.AllowedSeq > r.RevokedSeq):
				add(PropExecutedWhenEnded, t.ID, "ran after its approval was revoked", nil, []string{t.ID}, []string{t.BackendID})
			}
		}
		if !terminalTask[t.Status] {
			add(PropTaskNotTerminal, t.ID, fmt.Sprintf("still %s/%s after the settle bound %s", t.Status, t.Phase, h.Settle.Bound), nil, []string{t.ID}, []string{t.BackendID})
		}
		switch t.Disposition {
		case pep.ApprovedExecuted:
			if !executed {
				add(PropDispositionMismatch, t.ID, "approved-executed, but no side effect of its tool exists", nil, []string{t.ID}, []string{t.BackendID})
			}
		case pep.OutcomeUnknown:
			if t.ClaimedAt == nil {
				add(PropDispositionMismatch, t.ID, "outcome-unknown without an execution claim", nil, []string{t.ID}, []string{t.BackendID})
			}
		case pep.DeniedNotExecuted:
			// The run's policy does not change and its approvals outlast it:
			// nothing but a fault can turn an approval into a denial, and a
			// fault must only delay it (or end it outcome-unknown or failed).
			if r := ix.reqs[t.BackendID]; r != nil && r.Status == "approved" && r.RevokedSeq == 0 {
				add(PropApprovalDropped, t.ID, "its request is approved and was never revoked, yet it ended denied-not-executed: "+t.Reason, nil, []string{t.ID}, []string{t.BackendID})
			}
		}
	}

	live := map[string]bool{}
	for _, t := range h.Tasks {
		if !terminalTask[t.Status] && t.BackendID != "" {
			live[t.BackendID] = true
		}
	}
	for _, r := range h.Requests {
		// Use and revocation are serialized: a used approval is never
		// revoked (the revoker is told approval_already_used), so a
		// revocation recorded after a use was acknowledged falsely.
		if r.RevokedSeq > 0 && r.AllowedSeq > 0 && r.AllowedSeq < r.RevokedSeq {
			add(PropRevokedAfterUse, r.ID, "its approval was revoked after a re-evaluation had allowed a call with it", nil, nil, []string{r.ID})
		}
		if r.Status == "pending" && !live[r.ID] {
			add(PropRequestUntracked, r.ID, "pending, and no live task waits on it", nil, nil, []string{r.ID})
		}
		if r.Status != "pending" && r.HasCallback && r.Delivery != "delivered" && r.Delivery != "gone" && !r.Received && !r.Deferred(h.Settle.At) {
			add(PropCallbackMissing, r.ID, fmt.Sprintf("ended %s, and no callback delivery reached the receiver (delivery %q)", r.Status, r.Delivery), nil, nil, []string{r.ID})
		}
	}
	for _, in := range h.Intents {
		if in.State == "intent" {
			add(PropIntentWithout, in.Key, "submission intent of task "+in.TaskID+" neither bound, abandoned nor failed", nil, []string{in.TaskID}, nil)
		}
	}

	// What each client was told agrees with the tables: a terminal task
	// never changes, so a terminal status the client saw is the final one.
	for _, c := range h.Calls {
		if c.TaskID == "" || !terminalTask[c.Final] {
			continue
		}
		t := ix.tasks[c.TaskID]
		if t == nil {
			add(PropClientDisagrees, c.ID, "the client saw task "+c.TaskID+" end, but the front-end has no such task", []string{c.ID}, nil, nil)
			continue
		}
		if t.Status != c.Final || (c.Disp != "" && c.Disp != t.Disposition) {
			add(PropClientDisagrees, c.ID, fmt.Sprintf("client saw %s/%s, the table has %s/%s", c.Final, c.Disp, t.Status, t.Disposition), []string{c.ID}, []string{t.ID}, nil)
		}
	}

	for _, b := range h.Audit.BackendBreaks {
		add(PropAuditBreak, "arap", b, nil, nil, nil)
	}
	for _, b := range h.Audit.PEPBreaks {
		add(PropAuditBreak, "pep", b, nil, nil, nil)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Property != out[j].Property {
			return out[i].Property < out[j].Property
		}
		return out[i].Subject < out[j].Subject
	})
	return out
}

// Deferred says the request's callback has not reached the receiver yet
// but is pending with its next retry, by the backend's schedule, after at
// (the snapshot): not a violation, counted apart (Summary.Deferred).
func (r *RequestRow) Deferred(at time.Time) bool {
	return r.Delivery == "pending" && r.NextAttempt != nil && r.NextAttempt.After(at)
}

// mayHaveRun counts the call's tools/call attempts that may have run the
// tool: all but those answered "unavailable" (-31001, 429, 5xx), which say
// it did not run.
func (c *Call) mayHaveRun() int {
	n := 0
	for _, a := range c.Attempts {
		if strings.HasPrefix(a.Method, "tools/call") && a.Outcome != "unavailable" {
			n++
		}
	}
	return n
}

type historyIndex struct {
	h           *History
	calls       map[string]*Call
	tasks       map[string]*TaskRow
	reqs        map[string]*RequestRow
	callTasks   map[string][]string // call id -> tasks (through the requests carrying it)
	taskCall    map[string]string
	reqsOfTask  map[string][]string
	taskOfCall  map[string]string // the client's own record
	callOfReqID map[string]string
}

func index(h *History) *historyIndex {
	ix := &historyIndex{h: h, calls: map[string]*Call{}, tasks: map[string]*TaskRow{}, reqs: map[string]*RequestRow{},
		callTasks: map[string][]string{}, taskCall: map[string]string{}, reqsOfTask: map[string][]string{}, taskOfCall: map[string]string{},
		callOfReqID: map[string]string{}}
	for _, c := range h.Calls {
		ix.calls[c.ID] = c
		if c.TaskID != "" {
			ix.taskOfCall[c.ID] = c.TaskID
			ix.taskCall[c.TaskID] = c.ID
		}
	}
	for i := range h.Tasks {
		ix.tasks[h.Tasks[i].ID] = &h.Tasks[i]
	}
	for i := range h.Requests {
		r := &h.Requests[i]
		ix.reqs[r.ID] = r
		ix.callOfReqID[r.ID] = r.CallID
	}
	link := func(task, req string) {
		if task == "" || req == "" || slices.Contains(ix.reqsOfTask[task], req) {
			return
		}
		ix.reqsOfTask[task] = append(ix.reqsOfTask[task], req)
		if call := ix.callOfReqID[req]; call != "" {
			if !slices.Contains(ix.callTasks[call], task) {
				ix.callTasks[call] = append(ix.callTasks[call], task)
			}
			ix.taskCall[task] = call
		}
	}
	for _, t := range h.Tasks {
		link(t.ID, t.BackendID)
	}
	for _, in := range h.Intents {
		link(in.TaskID, in.BackendID)
	}
	for call, task := range ix.taskOfCall {
		if !slices.Contains(ix.callTasks[call], task) {
			ix.callTasks[call] = append(ix.callTasks[call], task)
		}
	}
	return ix
}

func (ix *historyIndex) tasksOfCall(call string) []string { return ix.callTasks[call] }
func (ix *historyIndex) callOfTask(task string) string    { return ix.taskCall[task] }

// minimal gathers the records touching the given calls, tasks and requests
// (and the ones linked to them), in time order, with the faults active
// meanwhile.
func (ix *historyIndex) minimal(calls, tasks, reqs []string) []Event {
	callSet, taskSet, reqSet := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, c := range calls {
		callSet[c] = true
		for _, t := range ix.callTasks[c] {
			taskSet[t] = true
		}
	}
	for _, t := range tasks {
		taskSet[t] = true
		if c := ix.taskCall[t]; c != "" {
			callSet[c] = true
		}
	}
	for t := range taskSet {
		for _, r := range ix.reqsOfTask[t] {
			reqSet[r] = true
		}
	}
	for _, r := range reqs {
		reqSet[r] = true
	}
	var ev []Event
	var from, to time.Time
	span := func(t time.Time) {
		if t.IsZero() {
			return
		}
		if from.IsZero() || t.Before(from) {
			from = t
		}
		if t.After(to) {
			to = t
		}
	}
	for c := range callSet {
		call := ix.calls[c]
		if call == nil {
			continue
		}
		for _, a := range call.Attempts {
			ev = append(ev, Event{At: a.At, What: fmt.Sprintf("client %d call %s %s %s: %s %s", call.Caller, c, a.Method, call.Tool, a.Outcome, a.Detail)})
			span(a.At)
		}
	}
	for _, e := range ix.h.Executions {
		if callSet[e.CallID] {
			ev = append(ev, Event{At: e.At, What: fmt.Sprintf("upstream ran %s for call %s", e.Tool, e.CallID)})
		}
	}
	for _, l := range ix.h.Ledger {
		if taskSet[l.TaskID] {
			ev = append(ev, Event{At: l.At, What: fmt.Sprintf("ledger: %s ran for task %s", l.Tool, l.TaskID)})
		}
	}
	for t := range taskSet {
		if r := ix.tasks[t]; r != nil {
			ev = append(ev, Event{At: r.CreatedAt, What: fmt.Sprintf("task %s created (%s), backend request %s", t, r.Tool, r.BackendID)})
			span(r.CreatedAt)
			if r.ClaimedAt != nil {
				ev = append(ev, Event{At: *r.ClaimedAt, What: fmt.Sprintf("task %s: execution claim taken", t)})
			}
			end := r.CreatedAt
			if r.TerminalAt != nil {
				end = *r.TerminalAt
			}
			ev = append(ev, Event{At: end, What: fmt.Sprintf("task %s: final %s, phase %s, disposition %q: %s", t, r.Status, r.Phase, r.Disposition, r.Reason)})
			span(end)
		}
	}
	for r := range reqSet {
		if q := ix.reqs[r]; q != nil {
			ev = append(ev, Event{At: q.CreatedAt, What: fmt.Sprintf("request %s created; final %s (callback delivery %q, received %v, revoked seq %d, allowed seq %d)", r, q.Status, q.DeliveryNote, q.Received, q.RevokedSeq, q.AllowedSeq)})
			span(q.CreatedAt)
			for _, a := range q.Audit {
				ev = append(ev, Event{At: q.CreatedAt, What: "  request " + r + " audit: " + a})
			}
		}
	}
	for _, d := range ix.h.Decisions {
		if reqSet[d.Request] {
			ev = append(ev, Event{At: d.At, What: fmt.Sprintf("approver: %s %s -> HTTP %d", d.Action, d.Request, d.Status)})
		}
	}
	for _, f := range ix.h.Faults {
		if !from.IsZero() && !f.Start.After(to) && !f.End.Before(from) {
			ev = append(ev, Event{At: f.Start, What: fmt.Sprintf("fault %s on %s until %s", f.Kind, f.Target, f.End.Format("15:04:05.000"))})
		}
	}
	sort.SliceStable(ev, func(i, j int) bool { return ev[i].At.Before(ev[j].At) })
	return ev
}
