package e2e

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/contract"
)

// TestDevCommand runs `arapd dev` on its own private PostgreSQL, checks the
// seeded token works, restarts it on the same data dir, and stops it.
func TestDevCommand(t *testing.T) {
	t.Parallel()
	dataDir := filepath.Join(t.TempDir(), "dev")
	for round := range 2 {
		p := startArapd(t, nil, "dev", "--addr", "127.0.0.1:0", "--mcp-addr", "127.0.0.1:0", "--data-dir", dataDir)
		// Through the contract proxy: every response must match openapi/arap.yaml.
		api := contract.Proxy(t, p.url(), httptest.NewUnstartedServer(nil))
		resp, err := http.Get(api + "/.well-known/authzen-configuration")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode)
		status, d := postJSON(t, api+"/access/v1/evaluation", "dev-pep-token", toolCall("wire_transfer", map[string]any{"to": "acct-991", "amount": 50000}))
		require.Equal(t, 200, status, "round %d", round)
		require.Contains(t, d["context"], "access_request")
		p.signal(syscall.SIGTERM)
		require.Equal(t, 0, p.wait(60*time.Second))
	}
}
