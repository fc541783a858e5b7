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
	s, err := Start(ctx, Options{Callers: 50})
	require.NoError(t, err)
	t.Cleanup(s.Stop)
	r, err := Run(ctx, s, Config{Concurrency: 4, Duration: 500 * time.Millisecond, Ops: AllOps, StatusRows: 2000, LatencyConcurrency: 2})
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
