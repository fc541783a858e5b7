package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/npmtest"
)

// TestSDKClientsFinish (issue 33): agents written on the official
// TypeScript SDK, v1 and v2, as released on npm, each get a wire_transfer
// of 50,000 approved and run, the way docs/clients.md tells a client
// author: without tasks through the approval tools (the call's result
// names a handle, approval_status follows it, the same call again runs
// it), and with the tasks extension through the task the server makes.
// The approver here is the ITSM client; the tool runs once for each.
func TestSDKClientsFinish(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{mcpArgs: []string{"--approval-tools"}})
	for i, c := range []struct{ pkg, script, mode string }{
		{npmtest.SDKv1, "agent-v1.mjs", "plain"},
		{npmtest.SDKv1, "agent-v1.mjs", "tasks"},
		{npmtest.SDKv2, "agent-v2.mjs", "legacy"},
		{npmtest.SDKv2, "agent-v2.mjs", "modern"},
		{npmtest.SDKv2, "agent-v2.mjs", "tasks"},
	} {
		t.Run(c.script+"/"+c.mode, func(t *testing.T) {
			dir := npmtest.Package(t, c.pkg)
			script, err := os.ReadFile(filepath.Join("testdata", "sdk", c.script))
			require.NoError(t, err)
			// Beside its node_modules, where its imports resolve.
			path := filepath.Join(dir, c.script)
			require.NoError(t, os.WriteFile(path, script, 0o644))
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			amount := 51000 + i
			cmd := osexec.CommandContext(ctx, "node", path, s.mcp.url()+"/mcp", c.mode)
			cmd.Env = append(os.Environ(), "MCP_TOKEN="+s.alice, "AMOUNT="+strconv.Itoa(amount))
			cmd.Stderr = &testWriter{t: t, prefix: c.script + " " + c.mode + ": "}
			out, err := cmd.StdoutPipe()
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			lines := bufio.NewScanner(out)
			next := func() map[string]any {
				require.True(t, lines.Scan(), "the agent ended without a line: %v", lines.Err())
				var m map[string]any
				require.NoError(t, json.Unmarshal(lines.Bytes(), &m), "%s", lines.Bytes())
				require.NotEqual(t, "error", m["event"], "%v", m)
				return m
			}
			pending := next()
			require.Equal(t, "pending", pending["event"], "%v", pending)
			handle := pending["handle"].(string)
			require.Equal(t, 200, s.decide(s.requestOf(handle), "approve"))
			done := next()
			require.Equal(t, "result", done["event"])
			raw, _ := json.Marshal(done["result"])
			require.Contains(t, string(raw), `"io.modelcontextprotocol/tool-approval-disposition":"approved-executed"`, "%s", raw)
			require.NoError(t, cmd.Wait())
			require.Equal(t, 1, s.ledger(handle), "the tool ran once")
		})
	}
}

// testWriter writes a process's output to the test log, line by line.
type testWriter struct {
	t      *testing.T
	prefix string
}

func (w *testWriter) Write(b []byte) (int, error) {
	w.t.Log(w.prefix + string(b))
	return len(b), nil
}
