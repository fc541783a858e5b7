package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

const (
	testToken  = "tok-7f3a9c1e5b"
	testTenant = "tenant-acme-42"
)

// mcpServer is a real go-sdk MCP server on loopback, which the test can
// stop and start again on the same address (a restarted process).
type mcpServer struct {
	t            *testing.T
	srv          *mcp.Server
	stateless    bool
	addr         string
	http         *http.Server
	entered      chan struct{} // a "block" call has started
	release      chan struct{} // lets "block" calls finish
	runs         atomic.Int32  // tool executions, all tools
	progress     chan struct{} // closed by the test when it has seen echo's progress
	jsonResponse bool
	dialled      atomic.Int32 // connections accepted
	subs         atomic.Int32 // subscriptions made to doc://a
	dropDiscover atomic.Int32
}

type serverOpts struct {
	stateless    bool
	noListChange bool
	jsonResponse bool // answer calls with application/json instead of SSE
	subscribe    bool // offer a resource, doc://a, with subscriptions (counted in subs)
	// dropDiscover is how many server/discover requests lose their
	// connection before any answer, as while the server restarts.
	dropDiscover int32
}

func startServer(t *testing.T, o serverOpts) *mcpServer {
	t.Helper()
	var sopts *mcp.ServerOptions
	if o.noListChange {
		sopts = &mcp.ServerOptions{Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: false}}}
	}
	s := &mcpServer{t: t, jsonResponse: o.jsonResponse, stateless: o.stateless, entered: make(chan struct{}, 10), release: make(chan struct{}), progress: make(chan struct{})}
	s.dropDiscover.Store(o.dropDiscover)
	if o.subscribe {
		if sopts == nil {
			sopts = &mcp.ServerOptions{}
		}
		sopts.SubscribeHandler = func(context.Context, *mcp.SubscribeRequest) error { s.subs.Add(1); return nil }
		sopts.UnsubscribeHandler = func(context.Context, *mcp.UnsubscribeRequest) error { return nil }
	}
	s.srv = mcp.NewServer(&mcp.Implementation{Name: "test-upstream", Version: "1"}, sopts)
	if o.subscribe {
		s.srv.AddResource(&mcp.Resource{URI: "doc://a", Name: "a"}, func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, Text: "a"}}}, nil
		})
	}
	obj := map[string]any{"type": "object", "properties": map[string]any{"text": map[string]any{"type": "string"}}}
	s.srv.AddTool(&mcp.Tool{
		Name:         "echo",
		Title:        "Echo",
		Description:  "says it back",
		InputSchema:  obj,
		OutputSchema: map[string]any{"type": "object", "properties": map[string]any{"said": map[string]any{"type": "string"}}},
		Annotations:  &mcp.ToolAnnotations{ReadOnlyHint: true, Title: "Echo it"},
	}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		s.runs.Add(1)
		var args map[string]any
		_ = jsonUnmarshal(req.Params.Arguments, &args)
		said := fmt.Sprint(args["text"])
		// Sent only at the level the request asked for (2026-07-28's
		// per-request logLevel; a 2025-11-25 session has none set).
		_ = req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: "info", Logger: "echo", Data: "echoing " + said})
		if tok := req.Params.GetProgressToken(); tok != nil {
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 1, Total: 2, Message: "half"})
			// Progress is delivered while the call runs; a notification that
			// arrives after the result has no call left to go to.
			select {
			case <-s.progress:
			case <-ctx.Done():
			}
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: said}}, StructuredContent: map[string]any{"said": said}}, nil
	})
	s.srv.AddTool(&mcp.Tool{Name: "fail", InputSchema: obj}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		s.runs.Add(1)
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "disk full"}}}, nil
	})
	s.srv.AddTool(&mcp.Tool{Name: "refuse", InputSchema: obj}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		// A protocol error whose message echoes what it was sent: the
		// gateway must not pass the credential on to its client.
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "bad params; you sent Bearer " + testToken + " to 127.0.0.1",
			Data: json.RawMessage(`{"field":"text","seen":"Bearer ` + testToken + `"}`)}
	})
	s.srv.AddTool(&mcp.Tool{Name: "block", InputSchema: obj}, func(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		s.runs.Add(1)
		s.entered <- struct{}{}
		select {
		case <-s.release:
		case <-ctx.Done():
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s.addr = ln.Addr().String()
	s.serve(ln)
	t.Cleanup(func() { s.stop() })
	return s
}

func (s *mcpServer) serve(ln net.Listener) {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.srv }, &mcp.StreamableHTTPOptions{Stateless: s.stateless, JSONResponse: s.jsonResponse})
	auth := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+testToken || r.Header.Get("X-Tenant") != testTenant {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			if bytes.Contains(body, []byte(`"method":"server/discover"`)) && s.dropDiscover.Add(-1) >= 0 {
				if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
					_ = conn.Close()
				}
				return
			}
			if bytes.Contains(body, []byte(`"name":"drop"`)) {
				// The "drop" tool runs, then its response is lost: the connection
				// closes without an answer while the server stays up.
				s.runs.Add(1)
				conn, _, err := http.NewResponseController(w).Hijack()
				if err == nil {
					_ = conn.Close()
				}
				return
			}
		}
		h.ServeHTTP(w, r)
	})
	hs := &http.Server{Handler: auth, ConnState: func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.dialled.Add(1)
		}
	}}
	s.http = hs
	go func() { _ = hs.Serve(ln) }()
}

// stop closes the listener and every connection at once, mid-call or not.
func (s *mcpServer) stop() { _ = s.http.Close() }

// restart serves again on the same address with a fresh handler, so a
// stateful server has forgotten its sessions, as a restarted process would.
func (s *mcpServer) restart() {
	ln, err := net.Listen("tcp", s.addr)
	require.NoError(s.t, err)
	s.serve(ln)
}

func (s *mcpServer) url() string { return "http://" + s.addr + "/mcp" }

func jsonUnmarshal(raw []byte, v any) error {
	if len(raw) == 0 {
		return nil
	}
	return json.Unmarshal(raw, v)
}

// httpConfig is a file with one HTTP upstream per server.
func httpConfig(t *testing.T, extra string, servers map[string]*mcpServer) *Config {
	t.Helper()
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(testToken+"\n"), 0o600))
	var b strings.Builder
	b.WriteString("upstreams:\n")
	for name, s := range servers {
		fmt.Fprintf(&b, "  - name: %s\n    http:\n      url: %s\n      headers: {X-Tenant: %s}\n    credentials: {file: %s}\n    timeouts: {connect: 5s, call: 5s}\n%s", name, s.url(), testTenant, tokenFile, extra)
	}
	cfg, err := Parse("test-upstreams.yaml", []byte(b.String()))
	require.NoError(t, err)
	return cfg
}

func newRegistry(t *testing.T, opts Options) *Registry {
	t.Helper()
	if opts.MinBackoff == 0 {
		opts.MinBackoff, opts.MaxBackoff = 20*time.Millisecond, 200*time.Millisecond
	}
	r := New(opts)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.Close(ctx)
	})
	return r
}

func toolNamed(r *Registry, name string) (Tool, bool) {
	for _, t := range r.Tools() {
		if t.Name == name {
			return t, true
		}
	}
	return Tool{}, false
}

func waitReady(t *testing.T, r *Registry, name string) {
	t.Helper()
	require.Eventually(t, func() bool { err, ok := r.Ready()[name]; return ok && err == nil }, 10*time.Second, 10*time.Millisecond)
}

func requireKind(t *testing.T, err error, k Kind) *Error {
	t.Helper()
	var ue *Error
	require.ErrorAs(t, err, &ue)
	require.Equal(t, k, ue.Kind, "%v", err)
	return ue
}

// TestLostDiscoverIsRetried: a server/discover that got no answer (the
// connection dropped, as while an upstream restarts) is a failed connect,
// retried; not a reason to settle on the legacy protocol, which would leave
// a 2026-07-28 upstream's subscriptions on sessions it forgets at once.
func TestLostDiscoverIsRetried(t *testing.T) {
	t.Parallel()
	s := startServer(t, serverOpts{stateless: true, dropDiscover: 1})
	r := newRegistry(t, Options{})
	require.NoError(t, r.Reload(context.Background(), httpConfig(t, "", map[string]*mcpServer{"svc": s})))
	waitReady(t, r, "svc")
	require.Less(t, s.dropDiscover.Load(), int32(0), "the first discover was dropped, a later one answered")
	st := r.Status()
	require.Len(t, st, 1)
	require.Equal(t, "2026-07-28", st[0].Protocol)
}

// TestHTTPProtocols: a 2026-07-28 (stateless) and a 2025-11-25 (session)
// upstream both work; tools keep schemas and annotations; tool errors are
// results; list_changed is followed.
func TestHTTPProtocols(t *testing.T) {
	for _, tc := range []struct {
		stateless bool
		protocol  string
	}{{true, "2026-07-28"}, {false, "2025-11-25"}} {
		t.Run(tc.protocol, func(t *testing.T) {
			t.Parallel()
			s := startServer(t, serverOpts{stateless: tc.stateless})
			changes := make(chan struct{}, 100)
			r := newRegistry(t, Options{})
			r.OnChange(func() { changes <- struct{}{} })
			cfg := httpConfig(t, "    prefix: up.\n    relist: 1h\n", map[string]*mcpServer{"svc": s})
			require.NoError(t, r.Reload(context.Background(), cfg))
			waitReady(t, r, "svc")
			st := r.Status()
			require.Len(t, st, 1)
			require.Equal(t, tc.protocol, st[0].Protocol)

			echo, ok := toolNamed(r, "up.echo")
			require.True(t, ok, "prefix applied: %v", r.Tools())
			require.Equal(t, "svc", echo.Upstream)
			require.Equal(t, "echo", echo.UpstreamTool)
			require.Equal(t, "echo", echo.Def.Name, "the definition is the upstream's, untouched")
			require.Equal(t, "up.echo", echo.Exposed().Name)
			require.Equal(t, "Echo it", echo.Def.Annotations.Title)
			require.True(t, echo.Def.Annotations.ReadOnlyHint)
			require.Equal(t, "Echo", echo.Def.Title)
			require.NotNil(t, echo.Def.OutputSchema)
			require.Contains(t, fmt.Sprint(echo.Def.OutputSchema), "said")
			require.Len(t, echo.Digest, 64)

			var progress atomic.Pointer[mcp.ProgressNotificationParams]
			var once sync.Once
			var logged atomic.Pointer[mcp.LoggingMessageParams]
			res, err := r.Call(context.Background(), "up.echo", map[string]any{"text": "hello"}, &CallOptions{
				Digest: echo.Digest,
				Progress: func(p *mcp.ProgressNotificationParams) {
					progress.Store(p)
					once.Do(func() { close(s.progress) })
				},
				Meta: mcp.Meta{"progressToken": "callers-own", mcp.MetaKeyLogLevel: "info"},
				Log:  func(p *mcp.LoggingMessageParams) { logged.Store(p) },
			})
			require.NoError(t, err)
			require.NotEqual(t, "callers-own", progress.Load().ProgressToken, "the upstream sees the gateway's token")
			if tc.stateless {
				// The caller's level went upstream, and the message on the
				// call's own stream came back (before the result).
				require.NotNil(t, logged.Load(), "the upstream's log message reached the caller")
				require.Equal(t, "echoing hello", logged.Load().Data)
				logged.Store(nil)
				_, err = r.Call(context.Background(), "up.echo", map[string]any{"text": "quiet"}, &CallOptions{
					Meta: mcp.Meta{mcp.MetaKeyLogLevel: "error"}, Log: func(p *mcp.LoggingMessageParams) { logged.Store(p) }})
				require.NoError(t, err)
				require.Nil(t, logged.Load(), "below the caller's level: not sent")
			}
			require.False(t, res.IsError)
			require.Equal(t, "hello", res.Content[0].(*mcp.TextContent).Text)
			require.Equal(t, map[string]any{"said": "hello"}, res.StructuredContent)
			require.NotNil(t, progress.Load(), "the upstream's progress reached the caller")
			require.Equal(t, "half", progress.Load().Message)

			res, err = r.Call(context.Background(), "up.fail", nil, nil)
			require.NoError(t, err, "a tool error is a result, not an error")
			require.True(t, res.IsError)

			_, err = r.Call(context.Background(), "up.refuse", nil, nil)
			ue := requireKind(t, err, Rejected)
			require.Equal(t, int64(jsonrpc.CodeInvalidParams), ue.Code)
			require.Contains(t, err.Error(), `upstream "svc"`)
			require.NotContains(t, err.Error(), testToken)
			require.NotContains(t, err.Error(), s.addr)
			// What a gateway passes on: the upstream's code, message and
			// data as it answered, its credential taken out.
			require.Equal(t, int64(jsonrpc.CodeInvalidParams), ue.RPC.Code)
			require.Equal(t, "bad params; you sent Bearer [redacted] to 127.0.0.1", ue.RPC.Message)
			require.JSONEq(t, `{"field":"text","seen":"Bearer [redacted]"}`, string(ue.RPC.Data))

			_, err = r.Call(context.Background(), "up.echo", nil, &CallOptions{Digest: strings.Repeat("0", 64)})
			requireKind(t, err, NotSent)
			require.ErrorIs(t, err, ErrToolChanged)
			// Decided for another upstream (the name moved): not sent here.
			_, err = r.Call(context.Background(), "up.echo", nil, &CallOptions{Digest: echo.Digest, Upstream: "other", UpstreamTool: "echo"})
			requireKind(t, err, NotSent)
			require.ErrorIs(t, err, ErrToolChanged)
			_, err = r.Call(context.Background(), "echo", nil, nil)
			requireKind(t, err, NotSent)
			require.ErrorIs(t, err, ErrUnknownTool)

			// list_changed is followed (relist is 1h, so this is the notification).
			for len(changes) > 0 {
				<-changes
			}
			s.srv.AddTool(&mcp.Tool{Name: "added", InputSchema: map[string]any{"type": "object"}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return &mcp.CallToolResult{}, nil
			})
			require.Eventually(t, func() bool { _, ok := toolNamed(r, "up.added"); return ok }, 10*time.Second, 10*time.Millisecond)
			require.Eventually(t, func() bool { return len(changes) > 0 }, 10*time.Second, 10*time.Millisecond, "OnChange told the front-end") // called after the set is visible
			s.srv.RemoveTools("added")
			require.Eventually(t, func() bool { _, ok := toolNamed(r, "up.added"); return !ok }, 10*time.Second, 10*time.Millisecond)
		})
	}
}

// TestRelistSchedule: an upstream that sends no list_changed is re-listed
// on its schedule.
func TestRelistSchedule(t *testing.T) {
	t.Parallel()
	s := startServer(t, serverOpts{stateless: true, noListChange: true})
	r := newRegistry(t, Options{})
	require.NoError(t, r.Reload(context.Background(), httpConfig(t, "    relist: 50ms\n", map[string]*mcpServer{"svc": s})))
	waitReady(t, r, "svc")
	s.srv.AddTool(&mcp.Tool{Name: "later", InputSchema: map[string]any{"type": "object"}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{}, nil
	})
	require.Eventually(t, func() bool { _, ok := toolNamed(r, "later"); return ok }, 10*time.Second, 10*time.Millisecond)
}

// TestHTTPFailures: the upstream dies mid-call (MaybeSent, never re-sent),
// is down before a call (NotSent), and is reconnected when it returns.
func TestHTTPFailures(t *testing.T) {
	for _, stateless := range []bool{true, false} {
		t.Run(fmt.Sprintf("stateless=%v", stateless), func(t *testing.T) {
			t.Parallel()
			s := startServer(t, serverOpts{stateless: stateless})
			r := newRegistry(t, Options{})
			require.NoError(t, r.Reload(context.Background(), httpConfig(t, "", map[string]*mcpServer{"svc": s})))
			waitReady(t, r, "svc")

			errc := make(chan error, 1)
			go func() {
				_, err := r.Call(context.Background(), "block", nil, nil)
				errc <- err
			}()
			<-s.entered
			s.stop()
			err := <-errc
			ue := requireKind(t, err, MaybeSent)
			t.Logf("mid-call: %v", err)
			require.Equal(t, "svc", ue.Upstream)
			require.NotContains(t, err.Error(), s.addr)
			require.NotContains(t, err.Error(), testToken)
			require.Equal(t, int32(1), s.runs.Load(), "the call ran once and was not re-sent")

			// Down: a call is refused before anything is written. The first
			// call may go out on a pooled connection the stop reset after
			// the write (MaybeSent); it makes the registry notice.
			_, err = r.Call(context.Background(), "echo", map[string]any{"text": "x"}, nil)
			require.Error(t, err)
			require.Eventually(t, func() bool { return r.Ready()["svc"] != nil }, 30*time.Second, 10*time.Millisecond)
			_, err = r.Call(context.Background(), "echo", map[string]any{"text": "x"}, nil)
			requireKind(t, err, NotSent)
			t.Logf("down: %v", err)
			require.Contains(t, err.Error(), `upstream "svc"`)
			require.NotContains(t, err.Error(), s.addr)
			require.NotContains(t, err.Error(), testToken)
			require.Equal(t, int32(1), s.runs.Load())
			require.Eventually(t, func() bool { return r.Ready()["svc"] != nil }, 10*time.Second, 10*time.Millisecond)
			require.NotContains(t, r.Ready()["svc"].Error(), s.addr)
			// Known to be down: refused without trying, the tool still listed.
			_, err = r.Call(context.Background(), "echo", map[string]any{"text": "x"}, nil)
			requireKind(t, err, NotSent)
			require.ErrorContains(t, err, "not connected")
			_, ok := toolNamed(r, "echo")
			require.True(t, ok, "the last list is kept while the upstream is down")

			// Back: reconnected with backoff, and calls work again.
			close(s.release)
			s.restart()
			waitReady(t, r, "svc")
			require.Eventually(t, func() bool {
				res, err := r.Call(context.Background(), "echo", map[string]any{"text": "again"}, nil)
				return err == nil && res.Content[0].(*mcp.TextContent).Text == "again"
			}, 10*time.Second, 20*time.Millisecond)
		})
	}
}

// TestCallTimeout: no answer within the call timeout is MaybeSent.
func TestCallTimeout(t *testing.T) {
	t.Parallel()
	s := startServer(t, serverOpts{stateless: true})
	defer close(s.release)
	r := newRegistry(t, Options{})
	cfg := httpConfig(t, "", map[string]*mcpServer{"svc": s})
	cfg.Upstreams[0].Call = 2 * time.Second
	require.NoError(t, r.Reload(context.Background(), cfg))
	waitReady(t, r, "svc")
	_, err := r.Call(context.Background(), "block", nil, nil)
	select {
	case <-s.entered: // the request reached the tool before the deadline
	default:
		t.Skip("the call timed out before its request was written (a stalled machine); MaybeSent needs a written request")
	}
	requireKind(t, err, MaybeSent)
	require.Contains(t, err.Error(), "no answer within 2s")
}

// TestCallAbandonedByCaller: a caller that goes away mid-call ends the
// forwarded call then, not at the call's own timeout (an hour here), though
// the call's context no longer derives from the caller's (send), and the
// failure says the outcome is unknown.
func TestCallAbandonedByCaller(t *testing.T) {
	t.Parallel()
	s := startServer(t, serverOpts{stateless: true})
	defer close(s.release)
	r := newRegistry(t, Options{})
	cfg := httpConfig(t, "", map[string]*mcpServer{"svc": s})
	cfg.Upstreams[0].Call = time.Hour
	require.NoError(t, r.Reload(context.Background(), cfg))
	waitReady(t, r, "svc")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := r.Call(ctx, "block", nil, nil)
		done <- err
	}()
	<-s.entered
	cancel()
	select {
	case err := <-done:
		requireKind(t, err, MaybeSent)
		require.Contains(t, err.Error(), "abandoned")
	case <-time.After(30 * time.Second):
		t.Fatal("the forwarded call outlived its caller")
	}
}

// TestUnreachableAtStart: an upstream that cannot be reached does not fail
// the load; it is reported, calls are NotSent, and it is connected when it
// comes up.
func TestUnreachableAtStart(t *testing.T) {
	t.Parallel()
	s := startServer(t, serverOpts{stateless: true})
	s.stop()
	r := newRegistry(t, Options{})
	require.NoError(t, r.Reload(context.Background(), httpConfig(t, "", map[string]*mcpServer{"svc": s})))
	err := r.Ready()["svc"]
	require.Error(t, err)
	require.NotContains(t, err.Error(), s.addr)
	require.Empty(t, r.Tools())
	s.restart()
	waitReady(t, r, "svc")
	require.Eventually(t, func() bool { _, ok := toolNamed(r, "echo"); return ok }, 10*time.Second, 10*time.Millisecond)
}

// TestCollision: two upstreams exposing one name are refused at load, and
// a reload that would collide leaves the previous set serving.
func TestCollision(t *testing.T) {
	t.Parallel()
	a, b := startServer(t, serverOpts{stateless: true}), startServer(t, serverOpts{stateless: false})
	r := newRegistry(t, Options{})
	err := r.Reload(context.Background(), httpConfig(t, "", map[string]*mcpServer{"a": a, "b": b}))
	require.Error(t, err)
	require.Contains(t, err.Error(), `tool name "echo" is exposed by upstream`)
	require.Contains(t, err.Error(), `"a"`)
	require.Contains(t, err.Error(), `"b"`)
	require.NotContains(t, err.Error(), testToken)
	require.Empty(t, r.Tools(), "nothing was taken on")

	// A good set, then a colliding reload: the good set stays, sessions too.
	good := httpConfig(t, "", map[string]*mcpServer{"a": a})
	require.NoError(t, r.Reload(context.Background(), good))
	waitReady(t, r, "a")
	before := sessionOf(r, 0)
	err = r.Reload(context.Background(), httpConfig(t, "", map[string]*mcpServer{"a": a, "b": b}))
	require.ErrorContains(t, err, "the previous set stays")
	_, ok := toolNamed(r, "echo")
	require.True(t, ok)
	require.Len(t, r.Status(), 1)
	require.True(t, before == sessionOf(r, 0), "the session was kept")
	_, err = r.Call(context.Background(), "echo", map[string]any{"text": "still"}, nil)
	require.NoError(t, err)

	// A reserved (built-in) name collides too.
	r2 := newRegistry(t, Options{Reserved: []string{"echo"}})
	require.ErrorContains(t, r2.Reload(context.Background(), good), "a built-in tool's name")
}

// TestReload: unchanged upstreams keep their sessions; a removed upstream
// finishes its in-flight call before it is closed.
func TestReload(t *testing.T) {
	t.Parallel()
	a, b := startServer(t, serverOpts{stateless: false}), startServer(t, serverOpts{stateless: true})
	r := newRegistry(t, Options{})
	require.NoError(t, r.Reload(context.Background(), httpConfig(t, "", map[string]*mcpServer{"a": a})))
	waitReady(t, r, "a")
	sessA := sessionOf(r, 0)

	// Same transport, new prefix: the session stays, the names change.
	require.NoError(t, r.Reload(context.Background(), httpConfig(t, "    prefix: a_\n", map[string]*mcpServer{"a": a})))
	require.True(t, sessA == sessionOf(r, 0), "the session was kept")
	_, ok := toolNamed(r, "a_echo")
	require.True(t, ok)

	errc := make(chan error, 1)
	go func() {
		_, err := r.Call(context.Background(), "a_block", nil, nil)
		errc <- err
	}()
	<-a.entered
	r.mu.Lock()
	retired := r.ups[0]
	r.mu.Unlock()
	require.NoError(t, r.Reload(context.Background(), httpConfig(t, "    prefix: b_\n", map[string]*mcpServer{"b": b})))
	waitReady(t, r, "b")
	_, ok = toolNamed(r, "a_echo")
	require.False(t, ok)
	select {
	case <-retired.done:
		t.Fatal("the removed upstream closed under an in-flight call")
	default:
	}
	close(a.release)
	require.NoError(t, <-errc, "the in-flight call finished on its session")
	<-retired.done
}

// sessionOf reads an upstream's current session, under the locks.
func sessionOf(r *Registry, i int) *mcp.ClientSession {
	r.mu.Lock()
	c := r.ups[i]
	r.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.session
}

// TestCollisionLater: a name that starts to collide after a list change
// stays with the tool that had it; the newcomer is withheld and reported.
func TestCollisionLater(t *testing.T) {
	t.Parallel()
	a, b := startServer(t, serverOpts{stateless: true}), startServer(t, serverOpts{stateless: true})
	r := newRegistry(t, Options{})
	cfg := httpConfig(t, "    relist: 1h\n", map[string]*mcpServer{"a": a, "b": b})
	for i := range cfg.Upstreams {
		cfg.Upstreams[i].Include = []string{"dyn"}
		if cfg.Upstreams[i].Name == "a" {
			cfg.Upstreams[i].Include = []string{"echo", "dyn"}
		}
	}
	require.NoError(t, r.Reload(context.Background(), cfg))
	waitReady(t, r, "a")
	waitReady(t, r, "b")
	dyn := func(from string) mcp.ToolHandler {
		return func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: from}}}, nil
		}
	}
	b.srv.AddTool(&mcp.Tool{Name: "dyn", InputSchema: map[string]any{"type": "object"}}, dyn("b"))
	require.Eventually(t, func() bool { tl, ok := toolNamed(r, "dyn"); return ok && tl.Upstream == "b" }, 10*time.Second, 10*time.Millisecond)
	a.srv.AddTool(&mcp.Tool{Name: "dyn", InputSchema: map[string]any{"type": "object"}}, dyn("a"))
	require.Eventually(t, func() bool {
		for _, s := range r.Status() {
			if s.Name == "a" && len(s.Withheld) == 1 {
				return strings.Contains(s.Withheld[0], `tool name "dyn" is exposed by upstream "b"`)
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond)
	tl, _ := toolNamed(r, "dyn")
	require.Equal(t, "b", tl.Upstream, "the name stays with the tool that had it")
	res, err := r.Call(context.Background(), "dyn", nil, nil)
	require.NoError(t, err)
	require.Equal(t, "b", res.Content[0].(*mcp.TextContent).Text)
}

// TestBadCredentials: an upstream refusing the gateway's credential is
// reported without the credential or the address.
func TestBadCredentials(t *testing.T) {
	t.Parallel()
	s := startServer(t, serverOpts{stateless: false})
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("wrong-token-9d8e7f"), 0o600))
	cfg, err := Parse("bad.yaml", []byte(fmt.Sprintf("upstreams:\n  - name: svc\n    http: {url: %q}\n    credentials: {file: %s}\n", s.url(), tokenFile)))
	require.NoError(t, err)
	r := newRegistry(t, Options{})
	require.NoError(t, r.Reload(context.Background(), cfg))
	err = r.Ready()["svc"]
	require.Error(t, err)
	t.Logf("reported: %v", err)
	require.NotContains(t, err.Error(), "wrong-token-9d8e7f")
	require.NotContains(t, err.Error(), s.addr)
	_, err = r.Call(context.Background(), "echo", nil, nil)
	requireKind(t, err, NotSent)
}

// TestLostResponseNotResent: the upstream ran the call and its response was
// lost while the upstream stayed reachable: MaybeSent, and the call is not
// sent again.
func TestLostResponseNotResent(t *testing.T) {
	for _, stateless := range []bool{true, false} {
		t.Run(fmt.Sprintf("stateless=%v", stateless), func(t *testing.T) {
			t.Parallel()
			s := startServer(t, serverOpts{stateless: stateless})
			s.srv.AddTool(&mcp.Tool{Name: "drop", InputSchema: map[string]any{"type": "object"}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return &mcp.CallToolResult{}, nil
			})
			r := newRegistry(t, Options{})
			require.NoError(t, r.Reload(context.Background(), httpConfig(t, "", map[string]*mcpServer{"svc": s})))
			waitReady(t, r, "svc")
			require.Eventually(t, func() bool { _, ok := toolNamed(r, "drop"); return ok }, 10*time.Second, 10*time.Millisecond)
			_, err := r.Call(context.Background(), "drop", nil, nil)
			requireKind(t, err, MaybeSent)
			require.Equal(t, int32(1), s.runs.Load(), "sent once, never again")
			// The upstream is still there: the next call works.
			_, err = r.Call(context.Background(), "echo", map[string]any{"text": "x"}, nil)
			require.NoError(t, err)
			require.Equal(t, int32(2), s.runs.Load())
		})
	}
}

// TestNoCredentialOnRedirect: an upstream that redirects does not get the
// gateway to carry its credential elsewhere.
func TestNoCredentialOnRedirect(t *testing.T) {
	t.Parallel()
	var leaked atomic.Int32
	other := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("Authorization"), testToken) || r.Header.Get("X-Tenant") != "" {
			leaked.Add(1)
		}
		http.Error(w, "nope", http.StatusNotFound)
	})}
	oln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = other.Serve(oln) }()
	t.Cleanup(func() { _ = other.Close() })
	redir := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://"+oln.Addr().String()+"/mcp", http.StatusTemporaryRedirect)
	})}
	rln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = redir.Serve(rln) }()
	t.Cleanup(func() { _ = redir.Close() })

	r := newRegistry(t, Options{})
	require.NoError(t, r.Reload(context.Background(), httpConfig(t, "", map[string]*mcpServer{"svc": {addr: rln.Addr().String()}})))
	require.Error(t, r.Ready()["svc"])
	require.Zero(t, leaked.Load(), "the credential went to the redirect target")
}

// TestResponseTooLarge: a JSON response over the bound is not read whole;
// the call was sent, so its outcome is unknown.
func TestResponseTooLarge(t *testing.T) {
	t.Parallel()
	s := startServer(t, serverOpts{stateless: true, jsonResponse: true})
	s.srv.AddTool(&mcp.Tool{Name: "huge", InputSchema: map[string]any{"type": "object"}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("x", maxJSONResponse+1)}}}, nil
	})
	r := newRegistry(t, Options{})
	require.NoError(t, r.Reload(context.Background(), httpConfig(t, "", map[string]*mcpServer{"svc": s})))
	waitReady(t, r, "svc")
	require.Eventually(t, func() bool { _, ok := toolNamed(r, "huge"); return ok }, 10*time.Second, 10*time.Millisecond)
	res, err := r.Call(context.Background(), "echo", map[string]any{"text": "small"}, nil)
	require.NoError(t, err, "JSON responses under the bound are read")
	require.Equal(t, "small", res.Content[0].(*mcp.TextContent).Text)
	_, err = r.Call(context.Background(), "huge", nil, nil)
	requireKind(t, err, MaybeSent)
}

// TestCallsReuseConnections: calls forwarded at once from many callers
// reuse the session's connections rather than dialling one per call past
// net/http's default of two idle per host.
func TestCallsReuseConnections(t *testing.T) {
	s := startServer(t, serverOpts{stateless: true})
	r := newRegistry(t, Options{})
	require.NoError(t, r.Reload(context.Background(), httpConfig(t, "    relist: 1h\n", map[string]*mcpServer{"svc": s})))
	waitReady(t, r, "svc")
	before := s.dialled.Load()
	const workers, calls = 8, 100
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range calls {
				if _, err := r.Call(context.Background(), "echo", map[string]any{"text": "hi"}, nil); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	// A few per caller at most: the SDK finishes reading a call's event
	// stream (and so frees its connection) just after it has handed the
	// result on, so a caller's next call may dial while that one drains,
	// more often on a busy machine (17 for 8 callers seen). Without reuse it
	// is one a call, or most calls past net/http's two idle per host.
	require.LessOrEqual(t, s.dialled.Load()-before, int32(4*workers), "connections dialled for %d calls from %d goroutines", workers*calls, workers)
}

// TestSubscriptionAfterReconnect: a resource subscription is made again on
// the upstream's new session after it was lost, and its updates reach the
// watcher again; an update about another URI, or from another upstream,
// does not.
func TestSubscriptionAfterReconnect(t *testing.T) {
	for _, stateless := range []bool{true, false} {
		t.Run(fmt.Sprintf("stateless=%v", stateless), func(t *testing.T) {
			t.Parallel()
			s := startServer(t, serverOpts{stateless: stateless, subscribe: true})
			other := startServer(t, serverOpts{stateless: stateless, subscribe: true})
			r := newRegistry(t, Options{})
			cfg := httpConfig(t, "", map[string]*mcpServer{"svc": s})
			cfg.Upstreams = append(cfg.Upstreams, httpConfig(t, "    prefix: o_\n", map[string]*mcpServer{"other": other}).Upstreams...)
			require.NoError(t, r.Reload(context.Background(), cfg))
			waitReady(t, r, "svc")
			waitReady(t, r, "other")
			require.True(t, r.Offered().Subscribe)

			updates := make(chan struct{}, 10)
			stop, err := r.Subscribe(context.Background(), "svc", "doc://a", func() { updates <- struct{}{} })
			require.NoError(t, err)
			defer stop()
			require.Eventually(t, func() bool { return s.subs.Load() == 1 }, 10*time.Second, 10*time.Millisecond)
			// other's doc://a is another resource: its updates reach only
			// its own watchers (the fan-out is done when they have it).
			fromOther := make(chan struct{}, 10)
			stopOther, err := r.Subscribe(context.Background(), "other", "doc://a", func() { fromOther <- struct{}{} })
			require.NoError(t, err)
			defer stopOther()
			require.Eventually(t, func() bool { return other.subs.Load() == 1 }, 10*time.Second, 10*time.Millisecond)
			require.NoError(t, other.srv.ResourceUpdated(context.Background(), &mcp.ResourceUpdatedNotificationParams{URI: "doc://a"}))
			<-fromOther
			require.Empty(t, updates, "svc's watcher does not hear other's update")
			require.NoError(t, s.srv.ResourceUpdated(context.Background(), &mcp.ResourceUpdatedNotificationParams{URI: "doc://a"}))
			<-updates
			require.Empty(t, fromOther)

			s.stop()
			_, _ = r.Call(context.Background(), "echo", map[string]any{"text": "x"}, nil) // makes the registry notice
			require.Eventually(t, func() bool { return r.Ready()["svc"] != nil }, 30*time.Second, 10*time.Millisecond)
			s.restart()
			waitReady(t, r, "svc")
			require.Eventually(t, func() bool { return s.subs.Load() == 2 }, 10*time.Second, 10*time.Millisecond, "subscribed again on the new session")
			// The upstream counts the new subscription when it is asked, a
			// moment before the stream that carries its updates to us may be
			// open (stateless: a subscriptions/listen stream): an update sent
			// in between reaches nobody, on a loaded machine seen to. So the
			// upstream sends updates until one arrives.
			require.Eventually(t, func() bool {
				if s.srv.ResourceUpdated(context.Background(), &mcp.ResourceUpdatedNotificationParams{URI: "doc://a"}) != nil {
					return false
				}
				select {
				case <-updates:
					return true
				case <-time.After(250 * time.Millisecond):
					return false
				}
			}, 30*time.Second, 10*time.Millisecond, "no update after the reconnect")
		})
	}
}
