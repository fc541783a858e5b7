package e2e

import (
	"encoding/json"
	"io"
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

// TestDevMailSink: in `arapd dev`, a new request's notices land in the
// built-in mail sink, listed at /dev/mail.json ({to, subject, text,
// received_at}) and /dev/mail (HTML): one to each treasury approver, with
// the link to the request page.
func TestDevMailSink(t *testing.T) {
	t.Parallel()
	p := startArapd(t, []string{"DATABASE_URL="}, "dev", "--addr", "127.0.0.1:0", "--mcp-addr", "127.0.0.1:0", "--data-dir", filepath.Join(t.TempDir(), ".arap-dev"))
	id := request(t, p.url(), p.url(), "dev-pep-token", toolCall("wire_transfer", map[string]any{"to": "acct-991", "amount": 50000}))
	type message struct {
		To         []string  `json:"to"`
		Subject    string    `json:"subject"`
		Text       string    `json:"text"`
		ReceivedAt time.Time `json:"received_at"`
	}
	var got []message
	require.Eventually(t, func() bool {
		resp, err := http.Get(p.url() + "/dev/mail.json")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		got = nil
		return resp.StatusCode == 200 && json.NewDecoder(resp.Body).Decode(&got) == nil && len(got) == 2
	}, 30*time.Second, 50*time.Millisecond)
	var to []string
	for _, m := range got {
		to = append(to, m.To...)
		require.Equal(t, "Approval needed: Treasury approval", m.Subject)
		require.Contains(t, m.Text, p.url()+"/ui/requests/"+id)
		require.False(t, m.ReceivedAt.IsZero())
	}
	require.ElementsMatch(t, []string{"bob@example.com", "carol@example.com"}, to)
	resp, err := http.Get(p.url() + "/dev/mail")
	require.NoError(t, err)
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	require.Contains(t, string(page), "/ui/requests/"+id)
	p.signal(syscall.SIGTERM)
	require.Equal(t, 0, p.wait(60*time.Second))
}
