package e2e

import (
	"net/http"
	"net/http/httptest"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/contract"
)

// TestDevCommand runs `arapd dev` on its own private PostgreSQL, checks the
// seeded token works and that arapctl's database commands, run where dev
// runs and without DATABASE_URL, reach the private cluster (its socket is in
// a directory named only in .arap-dev/database-url); restarts it on the
// same data dir, and stops it, after which arapctl says dev must be running.
func TestDevCommand(t *testing.T) {
	t.Parallel()
	work := t.TempDir()
	dataDir := filepath.Join(work, ".arap-dev")
	for round := range 2 {
		p := startArapd(t, []string{"DATABASE_URL="}, "dev", "--addr", "127.0.0.1:0", "--mcp-addr", "127.0.0.1:0", "--data-dir", dataDir)
		// Through the contract proxy: every response must match openapi/arap.yaml.
		api := contract.Proxy(t, p.url(), httptest.NewUnstartedServer(nil))
		resp, err := http.Get(api + "/.well-known/authzen-configuration")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode)
		status, d := postJSON(t, api+"/access/v1/evaluation", "dev-pep-token", toolCall("wire_transfer", map[string]any{"to": "acct-991", "amount": 50000}))
		require.Equal(t, 200, status, "round %d", round)
		require.Contains(t, d["context"], "access_request")

		code, out := arapctlIn(t, work, "attributes", "set", "round", "1")
		require.Equal(t, 0, code, out)
		require.Equal(t, "arapctl: DATABASE_URL is unset; using the database of arapd dev (.arap-dev/database-url)\n"+
			"attribute round set; automated resolvers of pending requests will run again\n", out)

		p.signal(syscall.SIGTERM)
		require.Equal(t, 0, p.wait(60*time.Second))
	}
	code, out := arapctlIn(t, work, "attributes", "list")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "its private cluster is reachable only while `arapd dev` runs")
}

// arapctlIn runs arapctl in dir without DATABASE_URL and returns its exit
// status and combined output.
func arapctlIn(t *testing.T, dir string, args ...string) (int, string) {
	t.Helper()
	require.NoError(t, buildErr)
	cmd := osexec.Command(filepath.Join(binDir, "arapctl"), args...)
	cmd.Dir = dir
	cmd.Env = withoutDatabaseURL(os.Environ())
	out, err := cmd.CombinedOutput()
	var ee *osexec.ExitError
	if err != nil {
		require.ErrorAs(t, err, &ee, "%s", out)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

// withoutDatabaseURL is env less DATABASE_URL.
func withoutDatabaseURL(env []string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "DATABASE_URL=") {
			out = append(out, kv)
		}
	}
	return out
}
