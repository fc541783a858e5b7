package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMCPOperations: `arapd mcp` as a process: /readyz ready, an access-log
// line per call (caller, tool, outcome, no token), the call counted on
// /metrics, and /readyz naming the backend once it is stopped.
func TestMCPOperations(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{})
	get := func(path string) (int, string) {
		resp, err := http.Get(s.mcp.url() + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	code, body := get("/readyz")
	require.Equal(t, http.StatusOK, code, body)

	c := s.client(s.alice)
	mark := s.mcp.mark()
	res, err := c.CallTool(context.Background(), "get_balance", map[string]any{}, nil)
	require.NoError(t, err)
	require.False(t, res.IsError, "%s", res.Raw)
	// The client lists the tools first; that request's line may be written
	// after its response was read, so the call's line is looked for by
	// method, not by order.
	line := s.mcp.waitLogWhere(mark, "http request", map[string]any{"rpc_method": "tools/call"}, 30*time.Second)
	require.Equal(t, "/mcp", line["route"])
	require.Equal(t, "alice-agent", line["caller"])
	require.Equal(t, "get_balance", line["tool"])
	require.Equal(t, "allowed-executed", line["outcome"])
	require.NotContains(t, strings.Join(s.mcp.logLines(), "\n"), s.alice)

	code, body = get("/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `arap_pep_calls_total{outcome="allowed-executed",tool="get_balance"} 1`)

	s.backend.signal(syscall.SIGTERM)
	require.Equal(t, 0, s.backend.wait(60*time.Second))
	code, body = get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	var out struct{ Failing []string }
	require.NoError(t, json.Unmarshal([]byte(body), &out))
	require.Equal(t, []string{"backend"}, out.Failing)
}
