package e2e

import (
	"encoding/json"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
)

// TestArapctlMCPResumesAfterKill kills `arapctl mcp call` (kill -9) while it
// waits; the task id it persisted lets `arapctl mcp wait` pick the task up
// and print the result once an ITSM system approves it. It also cancels a
// task with `arapctl mcp cancel`.
func TestArapctlMCPResumesAfterKill(t *testing.T) {
	t.Parallel()
	d := startDev(t, dbtest.URL(t))
	alice := append([]string{"ARAP_MCP_TOKEN=" + dev.AgentToken}, d.env...)
	stateFile := strings.TrimPrefix(d.env[1], "ARAP_MCP_STATE=")

	call := startArapctl(t, alice, "mcp", "call", "wire_transfer", "--arg", "to=acct-991", "--arg", "amount=60000")
	call.waitOutput(t, "working")
	require.NoError(t, call.cmd.Process.Signal(syscall.SIGKILL))
	code, out := call.exit(t)
	require.Equal(t, -1, code, "killed: %s", out)
	taskID := strings.Fields(out)[1]

	var remembered map[string]map[string]any
	b, err := os.ReadFile(stateFile)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &remembered))
	require.Contains(t, remembered, taskID, "the task id was persisted before waiting")
	info, err := os.Stat(stateFile)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	// `mcp get` shows where it is; an ITSM system approves it meanwhile.
	code, out = startArapctl(t, alice, "mcp", "get", taskID).exit(t)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "task "+taskID+" working")
	approveOnlyPending(t, d.api)

	code, out = startArapctl(t, alice, "mcp", "wait").exit(t)
	require.Equal(t, 0, code, out)
	require.Equal(t, 1, strings.Count(out, "task "+taskID+" completed"), "the final line once: %s", out)
	require.Contains(t, out, "Transfer of $60,000 to acct-991 completed")
	b, err = os.ReadFile(stateFile)
	require.NoError(t, err)
	require.NotContains(t, string(b), taskID, "a finished task is forgotten")
	code, out = startArapctl(t, alice, "mcp", "wait").exit(t)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "no unfinished tasks")

	// Cancel: the task ends cancelled, and waiting on it says so (exit 1).
	code, out = startArapctl(t, alice, "mcp", "call", "wire_transfer", "--arg", "to=acct-991", "--arg", "amount=70000", "--no-wait").exit(t)
	require.Equal(t, 0, code, out)
	second := strings.Fields(out)[1]
	code, out = startArapctl(t, alice, "mcp", "cancel", second).exit(t)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "task "+second+" cancelled")
	code, out = startArapctl(t, alice, "mcp", "wait", second).exit(t)
	require.Equal(t, 1, code, out)
	require.Equal(t, 1, strings.Count(out, "task "+second+" cancelled"), "the final line once: %s", out)

	// Another caller cannot see the task; bad input is refused plainly.
	mallory := append([]string{"ARAP_MCP_TOKEN=" + dev.Agent2Token}, d.env...)
	code, out = startArapctl(t, mallory, "mcp", "get", taskID).exit(t)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "not found")
	code, out = startArapctl(t, alice, "mcp", "call", "wire_transfer", "--arg", "amount").exit(t)
	require.Equal(t, 2, code, out)
	require.Contains(t, out, `--arg "amount": want name=value`)
	code, out = startArapctl(t, alice, "mcp", "call", "wire_transfer", "--arg", "to=acct-1", "--arg", "amount=-5").exit(t)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "invalid arguments for wire_transfer: amount: must be at least 0.01; use a larger number")
}

// approveOnlyPending approves the one pending request through the decision
// API as the dev ITSM system.
func approveOnlyPending(t *testing.T, base string) {
	t.Helper()
	var list struct {
		Requests []struct {
			ID string `json:"id"`
		} `json:"requests"`
	}
	getJSON(t, base+"/v1/requests?status=pending", dev.ITSMToken, &list)
	require.Len(t, list.Requests, 1)
	status, body := postJSON(t, base+"/v1/requests/"+list.Requests[0].ID+"/decisions", dev.ITSMToken,
		map[string]any{"decision": "approve", "reason": "CHG0042"})
	require.Equal(t, 200, status, "%v", body)
}
