package frontend_test

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/frontend"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
)

// TestMetricsListener: with a metrics address, the front-end serves
// /metrics there only (404 on the main listener); they include its pool's
// statistics and its jobs by kind and outcome.
func TestMetricsListener(t *testing.T) {
	ctx := context.Background()
	env := backendtest.Start(t, backendtest.Options{})
	f, err := frontend.New(ctx, frontend.Config{Addr: "127.0.0.1:0", DatabaseURL: dbtest.URL(t), MasterKey: make([]byte, 32), Tools: pep.DemoTools(),
		BackendURL: env.URL, BackendToken: dev.PEPToken, MetricsAddr: "127.0.0.1:0"})
	require.NoError(t, err)
	require.NoError(t, f.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = f.Stop(ctx)
	})
	s := &opsStack{env: env, f: f, log: &lockedBuffer{}}
	code, _ := s.get(t, pep.PathMetrics)
	require.Equal(t, http.StatusNotFound, code, "not on the main listener")
	code, _ = s.get(t, pep.PathHealth)
	require.Equal(t, http.StatusOK, code)

	alice := s.caller(t, "alice-agent")
	r, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-1", "amount": 50000}, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeTask, r.ResultType, "%s", r.Raw)

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		resp, err := http.Get("http://" + f.MetricsAddr() + pep.PathMetrics)
		require.NoError(c, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(c, http.StatusOK, resp.StatusCode)
		body := string(b)
		v, ok := metric(body, `arap_db_pool_max_conns{pool="frontend"}`)
		assert.True(c, ok && v != "0", "pool size: %q", v)
		_, ok = metric(body, `arap_db_pool_acquires_total{pool="frontend"}`)
		assert.True(c, ok)
		// The retention purge runs when the workers start.
		v, _ = metric(body, `arap_river_jobs_total{kind="pep.purge",outcome="completed"}`)
		assert.Equal(c, "1", v, "jobs counted")
		_, ok = metric(body, `arap_river_job_duration_seconds_count{kind="pep.purge"}`)
		assert.True(c, ok)
		_, ok = metric(body, `arap_pep_calls_total{outcome="task-created",tool="wire_transfer"}`)
		assert.True(c, ok, "the front-end's own metrics")
	}, 30*time.Second, 50*time.Millisecond)
}
