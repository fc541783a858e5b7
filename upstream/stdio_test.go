package upstream

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/npmtest"
)

// TestMain lets the test binary double as a stdio MCP server (the "self"
// upstream), so the stdio transport is tested against a real child process
// the test controls.
func TestMain(m *testing.M) {
	if os.Getenv("ARAP_UPSTREAM_TEST_CHILD") == "1" {
		selfServer()
		return
	}
	os.Exit(m.Run())
}

func selfServer() {
	s := mcp.NewServer(&mcp.Implementation{Name: "self", Version: "1"}, nil)
	obj := map[string]any{"type": "object"}
	s.AddTool(&mcp.Tool{Name: "env", InputSchema: obj}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		env := os.Environ()
		sort.Strings(env)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Join(env, "\n")}}}, nil
	})
	s.AddTool(&mcp.Tool{Name: "crash", InputSchema: obj}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		os.Exit(3) // dies with the call in hand: its outcome is unknown to the gateway
		return nil, nil
	})
	// progress reports progress, then waits until the test has seen it:
	// the test writes to the FIFO it names once the progress reached it.
	s.AddTool(&mcp.Tool{Name: "progress", InputSchema: obj}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if tok := req.Params.GetProgressToken(); tok != nil {
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 1, Message: "stdio half"})
			f, err := os.Open(os.Getenv("ARAP_TEST_PROGRESS_FIFO"))
			if err != nil {
				return nil, err
			}
			_, _ = f.Read(make([]byte, 1))
			_ = f.Close()
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "progressed"}}}, nil
	})
	_ = s.Run(context.Background(), &mcp.StdioTransport{})
}

// TestFilesystemServer runs the reference filesystem server over stdio:
// its tools keep their annotations and schemas, the prefix and the filters
// apply, calls work, and a tool error stays a result.
func TestFilesystemServer(t *testing.T) {
	t.Parallel()
	server := npmtest.Filesystem(t)
	root := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(root, "hello.txt"), []byte("hello from the upstream\n"), 0o644))
	doc := fmt.Sprintf(`
upstreams:
  - name: files
    stdio:
      command: %s
      args: [%q]
    prefix: fs.
    tools:
      include: ["read_*", "write_file", "list_directory"]
      exclude: ["read_media_file"]
      task_required: ["write_file"]
    timeouts: {connect: 60s, call: 30s}
`, server, root)
	cfg, err := Parse("fs.yaml", []byte(doc))
	require.NoError(t, err)
	r := newRegistry(t, Options{})
	require.NoError(t, r.Reload(context.Background(), cfg))
	waitReady(t, r, "files")
	require.Equal(t, "2025-11-25", r.Status()[0].Protocol, "the pinned TypeScript server falls back to a 2025-11-25 session")

	var names []string
	for _, tl := range r.Tools() {
		names = append(names, tl.Name)
	}
	require.Equal(t, []string{"fs.list_directory", "fs.read_file", "fs.read_multiple_files", "fs.read_text_file", "fs.write_file"}, names,
		"include, then exclude, then the prefix")

	read, _ := toolNamed(r, "fs.read_file")
	require.Equal(t, "read_file", read.UpstreamTool)
	require.True(t, read.Def.Annotations.ReadOnlyHint)
	require.NotNil(t, read.Def.Annotations.OpenWorldHint)
	require.False(t, *read.Def.Annotations.OpenWorldHint)
	require.NotNil(t, read.Def.OutputSchema)
	require.Contains(t, fmt.Sprint(read.Def.InputSchema), "path")
	require.False(t, read.TaskRequired)
	write, _ := toolNamed(r, "fs.write_file")
	require.NotNil(t, write.Def.Annotations.DestructiveHint)
	require.True(t, *write.Def.Annotations.DestructiveHint)
	require.True(t, write.Def.Annotations.IdempotentHint)
	require.True(t, write.TaskRequired)

	res, err := r.Call(context.Background(), "fs.read_file", map[string]any{"path": filepath.Join(root, "hello.txt")}, nil)
	require.NoError(t, err)
	require.False(t, res.IsError)
	require.Contains(t, res.Content[0].(*mcp.TextContent).Text, "hello from the upstream")

	res, err = r.Call(context.Background(), "fs.write_file", map[string]any{"path": filepath.Join(root, "out.txt"), "content": "written"}, nil)
	require.NoError(t, err)
	require.False(t, res.IsError)
	b, err := os.ReadFile(filepath.Join(root, "out.txt"))
	require.NoError(t, err)
	require.Equal(t, "written", string(b))

	// Outside its allowed directory: the upstream's tool error, as a result.
	res, err = r.Call(context.Background(), "fs.read_file", map[string]any{"path": "/etc/hostname"}, nil)
	require.NoError(t, err)
	require.True(t, res.IsError)

	_, err = r.Call(context.Background(), "fs.read_media_file", map[string]any{"path": "x"}, nil)
	requireKind(t, err, NotSent)
	require.ErrorIs(t, err, ErrUnknownTool, "an excluded tool is not offered")
}

// TestStdioChild: the child gets a clean environment with its credential,
// a child that dies with a call in hand is MaybeSent, and it is restarted.
func TestStdioChild(t *testing.T) {
	t.Setenv("ARAP_TEST_PARENT_SECRET", "parent-only-value")
	t.Setenv("ARAP_TEST_CHILD_CRED", "child-cred-value")
	fifo := filepath.Join(t.TempDir(), "progress")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	exe, err := os.Executable()
	require.NoError(t, err)
	doc := fmt.Sprintf(`
upstreams:
  - name: self
    stdio:
      command: %s
      env: {ARAP_UPSTREAM_TEST_CHILD: "1", ARAP_TEST_PROGRESS_FIFO: %q}
      dir: .
    credentials:
      env: ARAP_TEST_CHILD_CRED
      as_env: CHILD_TOKEN
    timeouts: {call: 20s}
`, exe, fifo)
	cfg, err := Parse(filepath.Join(t.TempDir(), "self.yaml"), []byte(doc))
	require.NoError(t, err)
	r := newRegistry(t, Options{})
	require.NoError(t, r.Reload(context.Background(), cfg))
	waitReady(t, r, "self")
	require.Equal(t, "2026-07-28", r.Status()[0].Protocol, "a go-sdk child speaks the stateless revision")

	res, err := r.Call(context.Background(), "env", nil, nil)
	require.NoError(t, err)
	env := res.Content[0].(*mcp.TextContent).Text
	require.Contains(t, env, "CHILD_TOKEN=child-cred-value")
	require.Contains(t, env, "ARAP_UPSTREAM_TEST_CHILD=1")
	require.NotContains(t, env, "parent-only-value", "the gateway's environment is not inherited")

	// Progress from a stdio child is relayed by the gateway's token; the
	// caller's token never goes to it.
	var seen atomic.Pointer[mcp.ProgressNotificationParams]
	res, err = r.Call(context.Background(), "progress", nil, &CallOptions{
		Meta: mcp.Meta{"progressToken": "callers-own"},
		Progress: func(p *mcp.ProgressNotificationParams) {
			if seen.Swap(p) == nil {
				f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
				if err == nil {
					_, _ = f.Write([]byte{1})
					_ = f.Close()
				}
			}
		}})
	require.NoError(t, err)
	require.Equal(t, "progressed", res.Content[0].(*mcp.TextContent).Text)
	require.NotNil(t, seen.Load())
	require.Equal(t, "stdio half", seen.Load().Message)
	require.NotEqual(t, "callers-own", seen.Load().ProgressToken)

	_, err = r.Call(context.Background(), "crash", nil, nil)
	ue := requireKind(t, err, MaybeSent)
	require.Equal(t, "self", ue.Upstream)
	require.NotContains(t, err.Error(), "child-cred-value")

	// The child is started again; calls work.
	require.Eventually(t, func() bool {
		_, err := r.Call(context.Background(), "env", nil, nil)
		return err == nil
	}, 10*time.Second, 20*time.Millisecond)
}
