package e2e

import (
	"os"
	osexec "os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
)

// TestReadmeCurl runs README.md's "Try the backend with curl" block as
// written (against this test's `arapd dev`, which listens on a free port
// instead of 8480): evaluate, submit the requestable denial, read the
// status, cancel.
func TestReadmeCurl(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"bash", "curl", "jq", "openssl"} {
		if _, err := osexec.LookPath(tool); err != nil {
			t.Skipf("the README's curl block needs %s (CI installs it)", tool)
		}
	}
	raw, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	doc := string(raw)
	start := strings.Index(doc, "### Try the backend with curl")
	require.GreaterOrEqual(t, start, 0)
	open := strings.Index(doc[start:], "```sh\n")
	require.GreaterOrEqual(t, open, 0)
	block := doc[start+open+len("```sh\n"):]
	block = block[:strings.Index(block, "```")]

	d := startDev(t, dbtest.URL(t))
	script := strings.ReplaceAll(block, "http://127.0.0.1:8480", d.p.url())
	cmd := osexec.Command("bash", "-e", "-o", "pipefail", "-c", script)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, want := range []string{`"access_request_endpoint"`, `"binding_token"`, `"status": "pending"`, `"status": "cancelled"`} {
		require.Contains(t, string(out), want)
	}
}
