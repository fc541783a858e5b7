package bench

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/pgembed"
)

// TestBenchRunsEveryOperation keeps arapbench working: a short run of every
// operation against a real system, with no errors, and each operation once
// more on its own, which must succeed. (Figures are for
// `go run ./cmd/arapbench`, not for tests.)
func TestBenchRunsEveryOperation(t *testing.T) {
	if _, err := pgembed.BinDir(); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	s, err := Start(ctx, Options{Callers: 50, Statements: true})
	require.NoError(t, err)
	t.Cleanup(s.Stop)
	r, err := Run(ctx, s, Config{Concurrency: 4, Duration: 500 * time.Millisecond, Ops: AllOps, StatusRows: 2000, LatencyConcurrency: 2, Statements: 5})
	require.NoError(t, err)
	require.Len(t, r.Rows, len(AllOps)+1, "gateway-allowed has a latency row and a throughput row")
	// How many complete within the window is a measurement: a loaded
	// machine stalls for seconds at times (an evaluation's p99 of 1.9 s
	// seen at load 12), so a window may end with none, and an operation
	// cut off by the window counts neither way. Errors count.
	for _, row := range append(r.Rows, Row{Stats: r.Baselines["http"]}, Row{Stats: r.Baselines["insert"]}, Row{Stats: r.Baselines["upstream"]}) {
		require.Zero(t, row.Errors, "%s: %s", row.Name, row.FirstError)
	}
	require.GreaterOrEqual(t, r.StatusRows, 2000)
	// PostgreSQL's profile of a measurement counts its calls' statements.
	if ins := r.Baselines["insert"]; ins.N > 0 {
		p := r.DB[ins.Name]
		require.NotNil(t, p)
		// The INSERT is among the window's statements, not necessarily
		// first: the backend's own jobs (River completing them) run
		// meanwhile and, with few calls in a short window on a loaded
		// machine, may take more time.
		i := slices.IndexFunc(p.Top, func(s Statement) bool { return strings.Contains(s.Query, "INSERT INTO public.bench_insert") })
		require.GreaterOrEqual(t, i, 0, "%+v", p.Top)
		// Calls cut off by the window's end may still have run.
		require.GreaterOrEqual(t, p.Top[i].Calls, 1.0, "one INSERT per call")
		require.Less(t, p.Top[i].Calls, 1.5)
	}
	// The CPU accounting finds PostgreSQL's backends (children of the
	// server) and arapd serve (/proc's clock ticks are 10 ms: enough calls
	// to take one).
	if ins := r.Baselines["insert"]; ins.N > 1000 {
		require.Positive(t, r.CPU[ins.Name].PerCall["postgres"])
	}
	for _, row := range r.Rows {
		if strings.HasPrefix(row.Name, "evaluate") && row.N > 1000 {
			require.Positive(t, r.CPU[row.Name].PerCall["arapd serve"])
		}
	}
	require.Positive(t, r.PeakRSS["arapd serve"])
	require.Positive(t, r.PeakRSS["arapd mcp"])

	// Each operation completes, however long it takes here.
	var next atomic.Int64
	var subs submitted
	once := func(name string, op Op) {
		t.Helper()
		c, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		_, err := op(c, 0)
		require.NoError(t, err, name)
	}
	once("evaluate-allow", s.Evaluate(true))
	once("evaluate-requestable", s.Evaluate(false))
	once("submit", s.Submit(nil, &subs))
	urls, err := subs.list()
	require.NoError(t, err)
	once("status", s.Status(urls))
	once("gate", s.Gate(&next))
	once("approve-to-complete", s.ApproveToComplete(&next))
	once("upstream tool, direct", s.Upstream(false, &next))
	once("upstream tool, through the gateway", s.Upstream(true, &next))
}
