package bench

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync/atomic"
	"text/tabwriter"
	"time"
)

// Config is one benchmark run.
type Config struct {
	Concurrency int           `json:"concurrency"`
	Duration    time.Duration `json:"duration_ns"`
	Warmup      time.Duration `json:"warmup_ns"`
	// Ops to run, from AllOps; status needs submit's requests.
	Ops []string `json:"ops"`
	// StatusRows is the size arap.requests is filled to before status runs.
	StatusRows int `json:"status_rows"`
	// LatencyConcurrency is the concurrency of the ops with a latency
	// target (status, approve-to-complete): a p99 measured at saturation
	// is queueing, not the service. Default 4.
	LatencyConcurrency int `json:"latency_concurrency"`
	// Statements, when not zero, profiles PostgreSQL during each
	// measurement and keeps that many statements by time (the system needs
	// Options.Statements).
	Statements int       `json:"statements,omitempty"`
	Log        io.Writer `json:"-"`
}

// AllOps are the operations, in run order. "evaluate" in Config.Ops
// stands for both evaluations.
var AllOps = []string{"evaluate-allow", "evaluate-requestable", "submit", "status", "gate", "approve-to-complete", "gateway-allowed"}

// Row is one line of the report.
type Row struct {
	Stats
	Baseline     string  `json:"baseline,omitempty"`
	BaselineRate float64 `json:"baseline_per_second,omitempty"`
	Ratio        float64 `json:"ratio,omitempty"`
	Target       string  `json:"target,omitempty"`
	Met          *bool   `json:"met,omitempty"`
}

// Report is a whole run.
type Report struct {
	Config     Config           `json:"config"`
	Rows       []Row            `json:"rows"`
	Baselines  map[string]Stats `json:"baselines"`
	PeakRSS    map[string]int64 `json:"peak_rss_bytes"`
	RSSMet     bool             `json:"rss_met"`
	StatusRows int              `json:"status_table_rows"` // rows in arap.requests when status was measured
	// DB is PostgreSQL's profile of each measurement, by its name (with
	// Config.Statements).
	DB map[string]*DBProfile `json:"db,omitempty"`
	// CPU is where each measurement's CPU time went, by its name.
	CPU map[string]*CPU `json:"cpu"`
}

// Run measures the baselines and then each op against s.
func Run(ctx context.Context, s *System, c Config) (*Report, error) {
	if c.Log == nil {
		c.Log = io.Discard
	}
	if c.LatencyConcurrency == 0 {
		c.LatencyConcurrency = 4
	}
	if i := slices.Index(c.Ops, "evaluate"); i >= 0 {
		c.Ops = slices.Replace(slices.Clone(c.Ops), i, i+1, "evaluate-allow", "evaluate-requestable")
	}
	r := &Report{Config: c, Baselines: map[string]Stats{}, PeakRSS: map[string]int64{}, DB: map[string]*DBProfile{}, CPU: map[string]*CPU{}}
	measure := func(name string, conc int, op Op) Stats {
		fmt.Fprintf(c.Log, "measuring %s (%d workers, %s)\n", name, conc, c.Duration)
		run(ctx, conc, c.Warmup, op) // apart, so that a profile covers the measured calls only
		var mark dbMark
		var err error
		if c.Statements > 0 {
			mark, err = s.markDB(ctx)
		}
		cpu := s.cpu()
		st := Measure(ctx, name, conc, 0, c.Duration, op)
		r.CPU[name] = s.cpu().since(cpu, st.N)
		fmt.Fprintln(c.Log, "  "+st.String())
		if c.Statements > 0 && err == nil {
			r.DB[name], err = s.profileDB(ctx, mark, st.N, c.Statements)
		}
		if err != nil {
			fmt.Fprintf(c.Log, "  no PostgreSQL profile of %s: %v\n", name, err)
		}
		return st
	}
	httpOp, stopHTTP, err := HTTPBaseline()
	if err != nil {
		return nil, err
	}
	r.Baselines["http"] = measure("baseline: HTTP JSON handler", c.Concurrency, httpOp)
	stopHTTP()
	insOp, stopIns, err := s.InsertBaseline(ctx, c.Concurrency)
	if err != nil {
		return nil, err
	}
	r.Baselines["insert"] = measure("baseline: single-row INSERT commit", c.Concurrency, insOp)
	stopIns()

	ratioRow := func(st Stats, base string, min float64) Row {
		b := r.Baselines[base]
		row := Row{Stats: st, Baseline: base, BaselineRate: b.PerSecond, Target: fmt.Sprintf(">= %.0f%% of %s", min*100, base)}
		if b.PerSecond > 0 {
			row.Ratio = st.PerSecond / b.PerSecond
		}
		met := row.Ratio >= min && st.Errors == 0
		row.Met = &met
		return row
	}
	latencyRow := func(st Stats, max time.Duration) Row {
		met := st.N > 0 && st.P99 < max && st.Errors == 0
		return Row{Stats: st, Target: "p99 < " + max.String(), Met: &met}
	}
	var subs submitted
	var next atomic.Int64
	if slices.Contains(c.Ops, "gate") || slices.Contains(c.Ops, "approve-to-complete") {
		fmt.Fprintf(c.Log, "listing the tools for %d callers\n", len(s.Callers))
		if err := s.ListTools(ctx, c.Concurrency); err != nil {
			return nil, err
		}
	}
	for _, op := range AllOps {
		if !slices.Contains(c.Ops, op) {
			continue
		}
		switch op {
		case "evaluate-allow":
			// Issue 37's targets: an allow pays no signature, a
			// requestable denial one ES256 binding_token.
			r.Rows = append(r.Rows, ratioRow(measure(op, c.Concurrency, s.Evaluate(true)), "http", 0.45))
		case "evaluate-requestable":
			r.Rows = append(r.Rows, ratioRow(measure(op, c.Concurrency, s.Evaluate(false)), "http", 0.30))
		case "submit":
			// Denials for a run at the target rate, made beforehand.
			n := int(0.3 * r.Baselines["insert"].PerSecond * (c.Warmup + c.Duration).Seconds())
			fmt.Fprintf(c.Log, "making %d denials to submit\n", n)
			ready, err := s.Submissions(ctx, n, c.Concurrency)
			if err != nil {
				return nil, err
			}
			r.Rows = append(r.Rows, ratioRow(measure(op, c.Concurrency, s.Submit(ready, &subs)), "insert", 0.25))
		case "status":
			if _, err := subs.list(); err != nil {
				// status reads need requests of this client: make some.
				Measure(ctx, "submit (for status)", c.Concurrency, 0, 3*time.Second, s.Submit(nil, &subs))
			}
			urls, err := subs.list()
			if err != nil {
				return nil, err
			}
			if c.StatusRows > 0 {
				var have int
				_ = s.DB.QueryRow(ctx, `SELECT count(*) FROM arap.requests`).Scan(&have)
				fmt.Fprintf(c.Log, "filling arap.requests to %d rows\n", c.StatusRows)
				if err := s.Fill(ctx, c.StatusRows-have); err != nil {
					return nil, err
				}
			}
			_ = s.DB.QueryRow(ctx, `SELECT count(*) FROM arap.requests`).Scan(&r.StatusRows)
			r.Rows = append(r.Rows, latencyRow(measure(op, c.LatencyConcurrency, s.Status(urls)), 10*time.Millisecond))
		case "gate":
			r.Rows = append(r.Rows, ratioRow(measure(op, c.Concurrency, s.Gate(&next)), "insert", 0.08))
		case "approve-to-complete":
			r.Rows = append(r.Rows, latencyRow(measure(op, c.LatencyConcurrency, s.ApproveToComplete(&next)), 100*time.Millisecond))
		case "gateway-allowed":
			// The same tool, directly and through the gateway, at the
			// latency and the throughput concurrency.
			direct := measure("baseline: upstream tool, direct (latency)", c.LatencyConcurrency, s.Upstream(false, &next))
			via := measure(op+" (latency)", c.LatencyConcurrency, s.Upstream(true, &next))
			r.Baselines["upstream-latency"] = direct
			added := via.P50 - direct.P50
			met := via.N > 0 && via.Errors == 0 && added <= time.Millisecond
			r.Rows = append(r.Rows, Row{Stats: via, Target: fmt.Sprintf("added p50 <= 1ms (added %s, p99 %s)", ms(added), ms(via.P99-direct.P99)), Met: &met})
			r.Baselines["upstream"] = measure("baseline: upstream tool, direct", c.Concurrency, s.Upstream(false, &next))
			r.Rows = append(r.Rows, ratioRow(measure(op, c.Concurrency, s.Upstream(true, &next)), "upstream", 0.60))
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("bench: interrupted: %w", err) // not a report of zeros
	}
	r.RSSMet = true
	for name, p := range map[string]*Process{"arapd serve": s.Serve, "arapd mcp": s.MCP} {
		rss, err := p.PeakRSS()
		if err != nil {
			return nil, err
		}
		r.PeakRSS[name] = rss
		if rss >= 150<<20 {
			r.RSSMet = false
		}
	}
	return r, nil
}

// Print writes the report as a table.
func (r *Report) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "operation\tworkers\tok\terrors\tper second\tp50\tp99\tbaseline/s\tratio\ttarget\tmet\t")
	for _, name := range []string{"http", "insert", "upstream-latency", "upstream"} {
		b, ok := r.Baselines[name]
		if !ok {
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f\t%s\t%s\t\t\t\t\t\n", b.Name, b.Concurrency, b.N, b.Errors, b.PerSecond, ms(b.P50), ms(b.P99))
	}
	for _, row := range r.Rows {
		base, ratio := "", ""
		if row.Baseline != "" {
			base, ratio = fmt.Sprintf("%.0f", row.BaselineRate), fmt.Sprintf("%.0f%%", row.Ratio*100)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t\n", row.Name, row.Concurrency, row.N, row.Errors, row.PerSecond, ms(row.P50), ms(row.P99),
			base, ratio, row.Target, yes(row.Met != nil && *row.Met))
	}
	tw.Flush()
	for _, name := range slices.Sorted(maps.Keys(r.PeakRSS)) {
		fmt.Fprintf(w, "peak RSS %s: %.0f MB\n", name, float64(r.PeakRSS[name])/(1<<20))
	}
	fmt.Fprintf(w, "RSS under 150 MB: %s; status read with %d rows in arap.requests\n", yes(r.RSSMet), r.StatusRows)
	fmt.Fprintf(w, "CPU per successful call, ms (user and system, from /proc):\n  %-36s", "")
	for _, p := range cpuParts {
		fmt.Fprintf(w, " %8s", p)
	}
	fmt.Fprintf(w, " %8s %6s\n", "total", "busy")
	for _, name := range []string{"http", "insert", "upstream-latency", "upstream"} {
		if b, ok := r.Baselines[name]; ok && r.CPU[b.Name] != nil {
			r.CPU[b.Name].print(w, b.Name)
		}
	}
	for _, row := range r.Rows {
		if c := r.CPU[row.Name]; c != nil {
			c.print(w, row.Name)
		}
	}
	for _, name := range []string{"http", "insert"} {
		if b, ok := r.Baselines[name]; ok && r.DB[b.Name] != nil {
			r.DB[b.Name].print(w, b.Name)
		}
	}
	for _, row := range r.Rows {
		if p := r.DB[row.Name]; p != nil {
			p.print(w, row.Name)
		}
	}
	for _, row := range r.Rows {
		if row.FirstError != "" {
			fmt.Fprintf(w, "first error of %s: %s\n", row.Name, row.FirstError)
		}
	}
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "NO"
}
