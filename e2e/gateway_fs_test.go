package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/internal/npmtest"
	"github.com/omcp/arap/mcp/tasks"
)

// filesReadOnly is the rule the test adds to the dev policy: what the files
// upstream marks read-only is allowed. write_file (destructiveHint: true)
// is left to the dev policy's destructive_tools rule: one approval.
const filesReadOnly = `
  - name: files_read_only
    match: {action: tools/call, resource_type: mcp_tool}
    when: >-
      resource.properties.upstream == "files" &&
      has(resource.properties.annotations) &&
      has(resource.properties.annotations.readOnlyHint) &&
      resource.properties.annotations.readOnlyHint == true
    effect: allow
`

// fsGateway is a stack whose arapd mcp fronts the reference filesystem
// server over stdio, rooted at root. Every request the server receives is
// also appended to tap (a tee in front of its stdin), so the test counts
// what reached the server, not what the gateway says it sent.
type fsGateway struct {
	*stack
	root string
	tap  string
	seq  int
}

func newFSGateway(t *testing.T) *fsGateway {
	t.Helper()
	server := npmtest.Filesystem(t)
	g := &fsGateway{root: t.TempDir(), tap: filepath.Join(t.TempDir(), "requests.jsonl")}
	ups := filepath.Join(t.TempDir(), "upstreams.yaml")
	require.NoError(t, os.WriteFile(ups, fmt.Appendf(nil, `
upstreams:
  - name: files
    stdio:
      command: sh
      args: ["-c", 'tee -a "$TAP" | exec "$SERVER" "$ROOT"']
      env: {TAP: %q, SERVER: %q, ROOT: %q}
    prefix: fs_
    timeouts: {connect: 60s}
`, g.tap, server, g.root), 0o600))
	g.stack = newStack(t, stackOptions{policy: string(dev.SeedPolicy()) + filesReadOnly, mcpArgs: []string{"--upstreams", ups}})
	g.connected(t)
	return g
}

// connected waits until the front-end offers the upstream's tools (it
// connects its upstreams after it starts serving).
func (g *fsGateway) connected(t *testing.T) {
	t.Helper()
	c := g.client(g.alice)
	require.Eventually(t, func() bool {
		r, err := c.Call(context.Background(), "tools/list", "", nil)
		if err != nil || r.Error != nil {
			return false
		}
		var out struct {
			Tools []struct {
				Name        string          `json:"name"`
				Annotations json.RawMessage `json:"annotations"`
			} `json:"tools"`
		}
		if json.Unmarshal(r.Result, &out) != nil {
			return false
		}
		n := 0
		for _, tl := range out.Tools {
			if tl.Name == "fs_read_file" || tl.Name == "fs_write_file" {
				n++
			}
		}
		return n == 2
	}, 90*time.Second, 100*time.Millisecond, "the filesystem server's tools are offered")
}

// requests is what the server received: each tools/call's tool and path.
func (g *fsGateway) requests() ([][2]string, error) {
	f, err := os.Open(g.tap)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var calls [][2]string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m struct {
			Method string `json:"method"`
			Params struct {
				Name      string `json:"name"`
				Arguments struct {
					Path string `json:"path"`
				} `json:"arguments"`
			} `json:"params"`
		}
		if json.Unmarshal(sc.Bytes(), &m) == nil && m.Method == "tools/call" {
			calls = append(calls, [2]string{m.Params.Name, m.Params.Arguments.Path})
		}
	}
	return calls, sc.Err()
}

// writes counts the write_file requests for path the server received.
func (g *fsGateway) writes(path string) (int, error) {
	calls, err := g.requests()
	n := 0
	for _, c := range calls {
		if c == [2]string{"write_file", path} {
			n++
		}
	}
	return n, err
}

// barrier makes every request sent to the server so far visible in the
// tap: a read through the gateway, waited for in the tap. The tee copies
// its input in order, so what reached the server before is there too.
func (g *fsGateway) barrier(t *testing.T) {
	t.Helper()
	g.seq++
	p := filepath.Join(g.root, fmt.Sprintf("barrier-%d.txt", g.seq))
	require.NoError(t, os.WriteFile(p, []byte("barrier"), 0o644))
	r, err := g.client(g.alice).CallTool(context.Background(), "fs_read_file", map[string]any{"path": p}, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeComplete, r.ResultType, "%s", r.Raw)
	require.Eventually(t, func() bool {
		calls, err := g.requests()
		return err == nil && containsCall(calls, [2]string{"read_file", p})
	}, 30*time.Second, 20*time.Millisecond, "the barrier read reaches the tap")
}

func containsCall(calls [][2]string, c [2]string) bool {
	for _, x := range calls {
		if x == c {
			return true
		}
	}
	return false
}

// disk is the file's content, or absent.
func disk(path string) (string, bool, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	return string(b), err == nil, err
}

// requireDisk checks what the server received for path and what is on disk:
// n write requests, and the file holding content (n > 0) or absent.
func (g *fsGateway) requireDisk(t *testing.T, path string, n int, content string) {
	t.Helper()
	g.barrier(t)
	require.NoError(t, g.effects(path, n, content)())
}

// effects is the check of requireDisk as a condition that reports a
// difference, for watching after the task ended.
func (g *fsGateway) effects(path string, n int, content string) func() error {
	return func() error {
		w, err := g.writes(path)
		if err != nil {
			return err
		}
		if w != n {
			return fmt.Errorf("%s: the server received %d write_file requests, want %d", filepath.Base(path), w, n)
		}
		got, present, err := disk(path)
		switch {
		case err != nil:
			return err
		case n == 0 && present:
			return fmt.Errorf("%s exists (%q) but was never to be written", filepath.Base(path), got)
		case n > 0 && got != content:
			return fmt.Errorf("%s holds %q (present %v), want %q", filepath.Base(path), got, present, content)
		}
		return nil
	}
}

// write calls fs_write_file as alice and returns its task: a destructive
// tool is requestable, and nothing reaches the server before a decision.
func (g *fsGateway) write(t *testing.T, path, content string) string {
	t.Helper()
	r, err := g.client(g.alice).CallTool(context.Background(), "fs_write_file", map[string]any{"path": path, "content": content}, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeTask, r.ResultType, "%s", r.Raw)
	g.requireDisk(t, path, 0, "")
	return r.Task.TaskID
}

// TestGatewayFilesystem puts arapd mcp in front of the reference
// filesystem MCP server (npm, stdio) in a temporary directory: read_file is
// allowed and answers at once; write_file waits for an approval and then
// writes the file exactly once; a denial or a cancel leaves the disk
// untouched; kill -9 of arapd mcp after the claim ends the task
// outcome-unknown with the file written at most once.
func TestGatewayFilesystem(t *testing.T) {
	t.Parallel()
	g := newFSGateway(t)
	ctx := context.Background()
	alice := g.client(g.alice)

	t.Run("read_file is allowed and returns the content", func(t *testing.T) {
		p := filepath.Join(g.root, "hello.txt")
		require.NoError(t, os.WriteFile(p, []byte("hello from the disk\n"), 0o644))
		r, err := alice.CallTool(ctx, "fs_read_file", map[string]any{"path": p}, nil)
		require.NoError(t, err)
		require.Equal(t, tasks.ResultTypeComplete, r.ResultType, "%s", r.Raw)
		require.False(t, r.IsError, "%s", r.Raw)
		require.Contains(t, string(r.Raw), "hello from the disk")
	})

	t.Run("an approved write_file writes the file exactly once", func(t *testing.T) {
		p, content := filepath.Join(g.root, "approved.txt"), "approved content\nline two\n"
		id := g.write(t, p, content)
		require.Equal(t, 200, g.decide(g.requestOf(id), "approve"))
		d := g.waitTask(alice, id)
		require.Equal(t, tasks.Completed, d.Status)
		text, m, isErr := resultText(t, d)
		require.False(t, isErr, "%s", d.Result)
		require.Equal(t, "approved-executed", m["io.modelcontextprotocol/tool-approval-disposition"])
		require.Contains(t, text, "Successfully wrote to "+p, "the upstream's own result")
		g.requireDisk(t, p, 1, content)
		g.nothingMoreHappens([]string{id}, g.effects(p, 1, content))
	})

	t.Run("a denied write_file leaves the disk untouched", func(t *testing.T) {
		p := filepath.Join(g.root, "denied.txt")
		id := g.write(t, p, "never")
		require.Equal(t, 200, g.decide(g.requestOf(id), "deny"))
		d := g.waitTask(alice, id)
		require.Equal(t, tasks.Completed, d.Status)
		_, m, isErr := resultText(t, d)
		require.True(t, isErr)
		require.Equal(t, "denied-not-executed", m["io.modelcontextprotocol/tool-approval-disposition"])
		g.requireDisk(t, p, 0, "")
		g.nothingMoreHappens([]string{id}, g.effects(p, 0, ""))
	})

	t.Run("a cancelled write_file leaves the disk untouched, approved later or not", func(t *testing.T) {
		p := filepath.Join(g.root, "cancelled.txt")
		id := g.write(t, p, "never")
		req := g.requestOf(id)
		require.NoError(t, alice.Cancel(ctx, id))
		d := g.waitTask(alice, id)
		require.Equal(t, tasks.Cancelled, d.Status)
		// An approval that comes anyway (the cancel reached the backend or
		// not) must not write.
		g.decide(req, "approve")
		g.requireDisk(t, p, 0, "")
		g.nothingMoreHappens([]string{id}, g.effects(p, 0, ""))
	})

	// kill -9 of arapd mcp at a point after the execution claim: the task
	// ends outcome-unknown after the restart and is never forwarded again.
	for _, tc := range []struct {
		point  string
		writes int // what reached the server before the kill
	}{
		{"pep.after-claim", 0},  // killed before forwarding
		{"pep.after-invoke", 1}, // killed with the answer in hand, unrecorded
	} {
		t.Run("kill -9 at "+tc.point+" ends outcome-unknown, written at most once", func(t *testing.T) {
			p, content := filepath.Join(g.root, "crash-"+tc.point+".txt"), "crash content "+tc.point
			require.NoError(t, g.mcp.cmd.Process.Kill())
			g.mcp.wait(10 * time.Second)
			g.mcp = g.startFaultyMCP(tc.point)
			g.connected(t)
			id := g.write(t, p, content)
			require.Equal(t, 200, g.decide(g.requestOf(id), "approve"))
			require.Equal(t, -1, g.mcp.wait(60*time.Second), "killed at %s", tc.point)
			g.mcp = g.startMCP()
			g.connected(t)
			d := g.waitTask(g.client(g.alice), id)
			require.Equal(t, tasks.Completed, d.Status)
			text, m, isErr := resultText(t, d)
			require.Equal(t, "outcome-unknown", m["io.modelcontextprotocol/tool-approval-disposition"], "%s", text)
			require.True(t, isErr)
			require.Contains(t, text, "may have run")
			g.requireDisk(t, p, tc.writes, content)
			g.nothingMoreHappens([]string{id}, g.effects(p, tc.writes, content))
		})
	}
}
