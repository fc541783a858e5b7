package bench

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/pgembed"
)

// TestBenchRunsEveryOperation keeps arapbench working: a short run of every
// operation against a real system, with no errors. (Figures are for
// `go run ./cmd/arapbench`, not for tests.)
func TestBenchRunsEveryOperation(t *testing.T) {
	if _, err := pgembed.BinDir(); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	s, err := Start(ctx, Options{Callers: 200}) // per-caller limits: 20 live tasks, 30 a minute
	require.NoError(t, err)
	t.Cleanup(s.Stop)
	// Each op must complete at least once within Duration; approve-to-
	// complete (a gated call, an approval, the callback, the run) took
	// 250-500 ms on a loaded 2-core machine, so 500 ms could end with none.
	// (Four times the callers of a 500 ms run: the same load per caller.)
	r, err := Run(ctx, s, Config{Concurrency: 4, Duration: 2 * time.Second, Ops: AllOps, StatusRows: 2000, LatencyConcurrency: 2})
	require.NoError(t, err)
	require.Len(t, r.Rows, len(AllOps))
	for _, row := range append(r.Rows, Row{Stats: r.Baselines["http"]}, Row{Stats: r.Baselines["insert"]}) {
		require.Zero(t, row.Errors, "%s: %s", row.Name, row.FirstError)
		require.Positive(t, row.N, row.Name)
	}
	require.GreaterOrEqual(t, r.StatusRows, 2000)
	require.Positive(t, r.PeakRSS["arapd serve"])
	require.Positive(t, r.PeakRSS["arapd mcp"])
}
