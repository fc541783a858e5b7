package chaos

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/omcp/arap/internal/fault"
)

// Summary is the run's figures.
type Summary struct {
	PerKind        map[string]*KindSummary
	PointHits      map[string]int
	Calls, Tasks   int
	Executions     int
	OutcomeUnknown int
	Retryable      int // retryable answers the clients saw (lost, unavailable, internal)
	Internal       int // of which internal errors (-32603, code 0): an outage answered as a bug
	// ApproverInternal: the approver's decisions answered 5xx other than
	// 503 (an outage must be 503 with Retry-After).
	ApproverInternal int
	Dispositions     map[string]int
	Violations       int
	Deferred         int // callbacks not yet received, retry scheduled after the settle
}

// Failures says why a run fails, if it does: violations, tasks not terminal
// at the settle bound, and, when the fault points were armed (armed), no
// outcome-unknown ending: the run must show the one ending at-most-once
// rests on, and that it is handled.
func (s *Summary) Failures(h *History, armed bool) []string {
	var out []string
	if s.Violations > 0 {
		out = append(out, fmt.Sprintf("%d violations", s.Violations))
	}
	if n := len(h.Settle.Unsettled); n > 0 {
		out = append(out, fmt.Sprintf("%d tasks not terminal at the settle bound", n))
	}
	if armed && s.OutcomeUnknown == 0 {
		out = append(out, "no task ended outcome-unknown: the execution claim's windows were not exercised")
	}
	return out
}

// KindSummary is one fault kind's figures.
type KindSummary struct {
	Injected     int
	Affected     int            // calls in flight or started while one was active
	Dispositions map[string]int // final disposition (or ending) of those calls
}

// Summarize computes the figures of a history.
func Summarize(h *History, v []Violation, hits map[string]int) *Summary {
	s := &Summary{PerKind: map[string]*KindSummary{}, PointHits: hits, Calls: len(h.Calls), Tasks: len(h.Tasks),
		Executions: len(h.Executions) + len(h.Ledger), Dispositions: map[string]int{}, Violations: len(v)}
	for i := range h.Requests {
		if r := &h.Requests[i]; r.Status != "pending" && r.HasCallback && !r.Received && r.Deferred(h.Settle.At) {
			s.Deferred++
		}
	}
	disp := map[string]string{}
	for _, t := range h.Tasks {
		d := t.Disposition
		if d == "" {
			d = t.Status
		}
		disp[t.ID] = d
		s.Dispositions[d]++
		if t.Disposition == "outcome-unknown" {
			s.OutcomeUnknown++
		}
	}
	ending := func(c *Call) string {
		if c.TaskID != "" {
			if d := disp[c.TaskID]; d != "" {
				return d
			}
		}
		if c.Final == "" {
			return "unknown"
		}
		return c.Kind + ":" + c.Final
	}
	for _, c := range h.Calls {
		for _, a := range c.Attempts {
			switch a.Outcome {
			case "lost", "unavailable":
				s.Retryable++
			case "internal":
				s.Retryable++
				s.Internal++
			}
		}
	}
	for _, d := range h.Decisions {
		if d.Status >= 500 && d.Status != 503 {
			s.ApproverInternal++
		}
	}
	for _, f := range h.Faults {
		k := s.PerKind[f.Kind]
		if k == nil {
			k = &KindSummary{Dispositions: map[string]int{}}
			s.PerKind[f.Kind] = k
		}
		k.Injected++
		for _, c := range h.Calls {
			end := c.End
			if end.IsZero() {
				end = f.End
			}
			if !c.Start.After(f.End) && !end.Before(f.Start) {
				k.Affected++
				k.Dispositions[ending(c)]++
			}
		}
	}
	return s
}

// Print writes the summary and every violation with its minimal history.
func (s *Summary) Print(w io.Writer, h *History, v []Violation) {
	kinds := make([]string, 0, len(s.PerKind))
	for k := range s.PerKind {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	fmt.Fprintf(w, "%-40s %8s %8s  %s\n", "fault kind", "injected", "affected", "outcomes of affected calls")
	for _, k := range kinds {
		ks := s.PerKind[k]
		fmt.Fprintf(w, "%-40s %8d %8d  %s\n", k, ks.Injected, ks.Affected, counts(ks.Dispositions))
	}
	fmt.Fprintln(w, "fault-point windows (kills reported by the armed points):")
	for _, n := range fault.Names {
		fmt.Fprintf(w, "  %-34s %6d\n", n, s.PointHits[n])
	}
	fmt.Fprintf(w, "calls %d, tasks %d, executions %d (upstream %d, ledger %d), outcome-unknown %d, retryable answers seen by clients %d (internal errors among them %d)\n",
		s.Calls, s.Tasks, s.Executions, len(h.Executions), len(h.Ledger), s.OutcomeUnknown, s.Retryable, s.Internal)
	fmt.Fprintf(w, "approver decisions answered 5xx other than 503: %d\n", s.ApproverInternal)
	fmt.Fprintf(w, "task endings: %s\n", counts(s.Dispositions))
	fmt.Fprintf(w, "audit: backend %d chains / %d events, front-end %d chains / %d events\n", h.Audit.BackendChains, h.Audit.BackendEvents, h.Audit.PEPChains, h.Audit.PEPEvents)
	fmt.Fprintf(w, "settle: %s of at most %s; unsettled tasks %d; callbacks deferred to a later retry %d\n", h.Settle.Took.Round(100e6), h.Settle.Bound, len(h.Settle.Unsettled), s.Deferred)
	fmt.Fprintf(w, "violations: %d\n", len(v))
	for _, x := range v {
		fmt.Fprintf(w, "VIOLATION %s %s: %s\n", x.Property, x.Subject, x.Detail)
		for _, e := range x.History {
			fmt.Fprintf(w, "    %s  %s\n", e.At.Format("15:04:05.000"), e.What)
		}
	}
}

func counts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", k, m[k])
	}
	return b.String()
}
