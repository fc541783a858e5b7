package frontend_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/frontend"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
)

// echoServer is a real MCP server (go-sdk, streamable HTTP) with one tool.
func echoServer(t *testing.T) string {
	t.Helper()
	s := sdk.NewServer(&sdk.Implementation{Name: "echo", Version: "1"}, nil)
	type in struct {
		Text string `json:"text"`
	}
	sdk.AddTool(s, &sdk.Tool{Name: "echo", Description: "Echo the text."},
		func(_ context.Context, _ *sdk.CallToolRequest, a in) (*sdk.CallToolResult, any, error) {
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: a.Text}}}, nil, nil
		})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, &sdk.StreamableHTTPOptions{Stateless: true})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String() + "/mcp"
}

// listed is the names tools/list shows alice.
func listed(t *testing.T, c *tasks.Client) map[string]bool {
	t.Helper()
	r, err := c.Call(context.Background(), "tools/list", "", nil)
	require.NoError(t, err)
	require.Nil(t, r.Error)
	var out struct {
		Tools []struct{ Name string } `json:"tools"`
	}
	require.NoError(t, json.Unmarshal(r.Result, &out))
	names := map[string]bool{}
	for _, tl := range out.Tools {
		names[tl.Name] = true
	}
	return names
}

// TestUpstreamsFile: arapd mcp --upstreams FILE offers the upstreams'
// tools beside the demo tools; a bad file is refused at startup naming its
// line; on reload (SIGHUP) a bad file leaves the running set and a good
// one replaces it; /readyz names an upstream that cannot be reached.
func TestUpstreamsFile(t *testing.T) {
	t.Parallel()
	url := echoServer(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "upstreams.yaml")
	write := func(s string) { require.NoError(t, os.WriteFile(file, []byte(s), 0o600)) }
	cfg := frontend.Config{Addr: "127.0.0.1:0", DatabaseURL: dbtest.URL(t), MasterKey: make([]byte, 32), Tools: pep.DemoTools(),
		BackendURL: "http://127.0.0.1:1", BackendToken: "unused", Upstreams: file}

	write("upstreams:\n  - name: echo\n    http: {url: " + url + "}\n    colour: blue\n")
	_, err := frontend.New(context.Background(), cfg)
	require.ErrorContains(t, err, file+":4:")

	write("upstreams:\n  - name: echo\n    http: {url: " + url + "}\n    prefix: a_\n")
	f, err := frontend.New(context.Background(), cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	reload := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx, reload) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	p := pep.Principal{SubjectType: "user", SubjectID: "alice", ActorID: "agent:demo"}
	require.NoError(t, f.Gate().Callers().Create(context.Background(), "alice-agent", "alice-token-0123", p))
	alice := &tasks.Client{URL: f.URL() + pep.PathMCP, Token: "alice-token-0123"}
	require.Eventually(t, func() bool { return listed(t, alice)["a_echo"] }, 30*time.Second, 50*time.Millisecond)
	require.True(t, listed(t, alice)["wire_transfer"], "the demo tools stay")

	write("upstreams: [")
	reload <- struct{}{}
	reload <- struct{}{} // taken only once the first reload has ended
	require.True(t, listed(t, alice)["a_echo"], "a bad file leaves the running set")
	write("upstreams:\n  - name: echo\n    http: {url: " + url + "}\n    prefix: b_\n")
	reload <- struct{}{}
	require.Eventually(t, func() bool { n := listed(t, alice); return n["b_echo"] && !n["a_echo"] }, 30*time.Second, 50*time.Millisecond)

	write("upstreams:\n  - name: gone\n    http: {url: http://127.0.0.1:1/mcp}\n")
	reload <- struct{}{}
	require.Eventually(t, func() bool {
		resp, err := http.Get(f.URL() + "/readyz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var body struct{ Failing []string }
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode == http.StatusServiceUnavailable && contains(body.Failing, "upstream:gone")
	}, 30*time.Second, 50*time.Millisecond)
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
