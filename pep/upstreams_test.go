package pep_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
	up "github.com/omcp/arap/upstream"
)

// gatewayPolicy allows what an upstream marks read-only and makes what it
// marks destructive requestable (one platform approval); all else is denied.
const gatewayPolicy = `
version: 1
rules:
  - name: read_only
    match: {action: tools/call, resource_type: mcp_tool}
    when: has(resource.properties.annotations) && has(resource.properties.annotations.readOnlyHint) && resource.properties.annotations.readOnlyHint == true && resource.properties.upstream == "ext"
    effect: allow
  - name: destructive
    match: {action: tools/call, resource_type: mcp_tool}
    when: has(resource.properties.annotations) && has(resource.properties.annotations.destructiveHint) && resource.properties.annotations.destructiveHint == true
    effect: request
    template: destructive
    approval: {quorum: 1, groups: [platform], kinds: [itsm]}
`

type extServer struct {
	purges atomic.Int64
	// entered gets a value when purge starts.
	entered chan struct{}
	// stall, when set, makes purge wait until the call's context ends
	// (its response never comes).
	stall atomic.Bool
	http  *http.Server
	url   string
}

// startExt runs a real MCP server (go-sdk, streamable HTTP, stateless) on
// loopback with a read-only tool, lookup, and a destructive one, purge.
func startExt(t *testing.T) *extServer {
	t.Helper()
	e := &extServer{entered: make(chan struct{}, 10)}
	// Tools only: no logging either (the SDK's default offers it).
	s := sdk.NewServer(&sdk.Implementation{Name: "ext", Version: "1"}, &sdk.ServerOptions{Capabilities: &sdk.ServerCapabilities{}})
	yes := true
	type lookupIn struct {
		Q string `json:"q"`
	}
	sdk.AddTool(s, &sdk.Tool{Name: "lookup", Description: "Look something up.", Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, _ *sdk.CallToolRequest, in lookupIn) (*sdk.CallToolResult, any, error) {
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "found " + in.Q}}}, nil, nil
		})
	type purgeIn struct {
		Target string `json:"target"`
	}
	sdk.AddTool(s, &sdk.Tool{Name: "purge", Description: "Purge a target.", Annotations: &sdk.ToolAnnotations{DestructiveHint: &yes}},
		func(ctx context.Context, _ *sdk.CallToolRequest, in purgeIn) (*sdk.CallToolResult, any, error) {
			e.purges.Add(1)
			e.entered <- struct{}{}
			if e.stall.Load() {
				<-ctx.Done()
			}
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "purged " + in.Target}}}, nil, nil
		})
	// strict answers with a JSON-RPC error of its own (as a server that
	// needs a client capability the call did not declare).
	sdk.AddTool(s, &sdk.Tool{Name: "strict", Description: "Needs sampling.", Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *sdk.CallToolRequest, lookupIn) (*sdk.CallToolResult, any, error) {
			return nil, nil, &jsonrpc.Error{Code: -32021, Message: "missing required client capability: sampling",
				Data: json.RawMessage(`{"requiredCapabilities":{"sampling":{}}}`)}
		})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	e.http = &http.Server{Handler: sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, &sdk.StreamableHTTPOptions{Stateless: true})}
	go func() { _ = e.http.Serve(ln) }()
	t.Cleanup(func() { _ = e.http.Close() })
	e.url = "http://" + ln.Addr().String() + "/mcp"
	return e
}

// approvedPurge opens an ext_purge task on target and approves its request.
func (p *stack) approvedPurge(t *testing.T, target string) string {
	t.Helper()
	r, err := p.alice.CallTool(context.Background(), "ext_purge", map[string]any{"target": target}, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeTask, r.ResultType, "%s", r.Raw)
	p.approve(t, p.request(t, r.Task.TaskID), time.Now().Add(time.Hour))
	return r.Task.TaskID
}

// gatewayPEP is the real gate in front of ext through a real registry.
func gatewayPEP(t *testing.T, ext *extServer, call time.Duration, opts ...pepOptions) (*stack, *up.Registry) {
	t.Helper()
	cfg, err := up.Parse("upstreams.yaml", []byte(`
upstreams:
  - name: ext
    http: {url: `+ext.url+`}
    prefix: ext_
    timeouts: {call: `+call.String()+`}
`))
	require.NoError(t, err)
	reg := up.New(up.Options{MinBackoff: 50 * time.Millisecond})
	t.Cleanup(func() { _ = reg.Close(context.Background()) })
	require.NoError(t, reg.Reload(context.Background(), cfg))
	require.Eventually(t, func() bool { return len(reg.Tools()) == 3 }, 30*time.Second, 20*time.Millisecond, "the upstream's tools are listed")
	var o pepOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	o.policy, o.sources = []byte(gatewayPolicy), []pep.ToolSource{pep.NewUpstreams(reg, nil)}
	return newPEP(t, o), reg
}

// TestUpstreamToolsThroughTheGate: a real upstream MCP server's tools are
// offered under their prefix; a read-only one the policy allows is
// forwarded at once; a destructive one becomes a task and is forwarded
// exactly once after approval, its result the upstream's.
func TestUpstreamToolsThroughTheGate(t *testing.T) {
	t.Parallel()
	ext := startExt(t)
	p, _ := gatewayPEP(t, ext, 30*time.Second)
	ctx := context.Background()

	r, err := p.alice.CallTool(ctx, "ext_lookup", map[string]any{"q": "x1"}, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeComplete, r.ResultType, "%s", r.Raw)
	require.Contains(t, string(r.Raw), "found x1")

	// The upstream's own JSON-RPC error on an allowed call reaches the
	// caller as it answered it: code, message, data (and, on 2026-07-28,
	// the HTTP status its code takes); not a tool result.
	_, err = p.alice.CallTool(ctx, "ext_strict", map[string]any{"q": "x"}, nil)
	var rpcErr *tasks.RPCError
	require.ErrorAs(t, err, &rpcErr)
	require.Equal(t, -32021, rpcErr.Code)
	require.Equal(t, "missing required client capability: sampling", rpcErr.Message)
	require.JSONEq(t, `{"requiredCapabilities":{"sampling":{}}}`, string(rpcErr.Data))
	require.Equal(t, http.StatusBadRequest, rpcErr.HTTPStatus)

	r, err = p.alice.CallTool(ctx, "ext_purge", map[string]any{"target": "cache"}, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeTask, r.ResultType, "%s", r.Raw)
	id := r.Task.TaskID
	p.advance(t, id) // what the tracking job does before any decision
	require.Zero(t, ext.purges.Load(), "nothing is forwarded before approval")
	p.approve(t, p.request(t, id), time.Now().Add(time.Hour))
	p.advance(t, id)
	d := p.get(t, id)
	require.Equal(t, tasks.Completed, d.Status)
	require.Contains(t, string(d.Result), "purged cache")
	require.Equal(t, "approved-executed", disposition(t, d))
	p.advance(t, id)
	require.EqualValues(t, 1, ext.purges.Load(), "forwarded exactly once")
}

// TestUpstreamResponseLostAfterClaim: an approved call whose upstream
// response never comes ends outcome-unknown and is never sent again.
func TestUpstreamResponseLostAfterClaim(t *testing.T) {
	t.Parallel()
	ext := startExt(t)
	p, _ := gatewayPEP(t, ext, 5*time.Second)
	ext.stall.Store(true)
	id := p.approvedPurge(t, "db")
	p.advance(t, id)
	select {
	case <-ext.entered:
	default:
		t.Fatal("the approved call never reached the upstream")
	}
	d := p.get(t, id)
	require.Equal(t, "outcome-unknown", disposition(t, d), "%s", d.Result)
	p.advance(t, id)
	require.EqualValues(t, 1, ext.purges.Load(), "never re-sent")
}

// TestUpstreamNotConnectedIsNotGone: an approved call whose upstream is
// not connected when it is advanced (a restart, a reconnect) waits; it is
// not denied as if its tool were gone, and nothing runs.
func TestUpstreamNotConnectedIsNotGone(t *testing.T) {
	t.Parallel()
	ext := startExt(t)
	p, reg := gatewayPEP(t, ext, 5*time.Second)
	ctx := context.Background()
	id := p.approvedPurge(t, "tmp")
	require.NoError(t, reg.Close(ctx)) // its tools are unknown now
	_, err := p.gate.Advance(ctx, id)
	require.ErrorContains(t, err, "not connected")
	require.Equal(t, tasks.Working, p.get(t, id).Status, "still waiting, not denied")
	require.Zero(t, ext.purges.Load())
}

// TestUpstreamDownBeforeClaim: an approved call whose upstream cannot be
// reached until the run's deadline ends failed, saying which upstream and
// that the tool did not run, without the upstream's address.
func TestUpstreamDownBeforeClaim(t *testing.T) {
	t.Parallel()
	ext := startExt(t)
	p, _ := gatewayPEP(t, ext, 5*time.Second, pepOptions{execTimeout: 3 * time.Second})
	ctx := context.Background()
	id := p.approvedPurge(t, "logs")
	require.NoError(t, ext.http.Close())
	p.advance(t, id)
	d := p.get(t, id)
	require.Equal(t, tasks.Failed, d.Status, "%+v", d)
	_, raw, err := p.alice.Get(ctx, id)
	require.NoError(t, err)
	require.Contains(t, string(raw), "upstream ext")
	require.Contains(t, string(raw), "did not run")
	require.NotContains(t, string(raw), "127.0.0.1", "the upstream's address is not shown")
	require.Zero(t, ext.purges.Load())
}

// TestUpstreamBlipAfterClaim: an approved call whose upstream refuses
// connections when it is claimed is sent once the upstream is back, within
// the run's deadline: it runs exactly once and ends approved-executed,
// rather than failed for a network blip (found by the chaos run).
func TestUpstreamBlipAfterClaim(t *testing.T) {
	t.Parallel()
	ext := startExt(t)
	p, _ := gatewayPEP(t, ext, 5*time.Second)
	ctx := context.Background()
	id := p.approvedPurge(t, "cache")
	addr := strings.TrimSuffix(strings.TrimPrefix(ext.url, "http://"), "/mcp")
	handler := ext.http.Handler
	require.NoError(t, ext.http.Close())

	advanced := make(chan error, 1)
	go func() { _, err := p.gate.Advance(ctx, id); advanced <- err }()
	// Claimed while the upstream is down: then it comes back, on the same
	// address.
	require.Eventually(t, func() bool {
		var phase string
		err := p.db.QueryRow(ctx, `SELECT phase FROM pep.approval_tasks WHERE task_id = $1`, id).Scan(&phase)
		return err == nil && phase == "claimed"
	}, 30*time.Second, 10*time.Millisecond)
	require.Zero(t, ext.purges.Load())
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	back := &http.Server{Handler: handler}
	go func() { _ = back.Serve(ln) }()
	t.Cleanup(func() { _ = back.Close() })

	select {
	case err := <-advanced:
		require.NoError(t, err)
	case <-time.After(60 * time.Second):
		t.Fatal("the claimed run did not end")
	}
	d := p.get(t, id)
	require.Equal(t, "approved-executed", disposition(t, d), "%s", d.Result)
	require.EqualValues(t, 1, ext.purges.Load(), "sent once it could be, and once only")
}

// connecting is a source that says it connects to its upstreams.
type connecting struct{ pep.StaticTools }

func (connecting) Connected(string) bool { return true }

// TestUnusableUpstreamToolDoesNotStopStartup: an upstream tool whose schema
// this server cannot use is left out; the gate starts and offers the rest.
// (A built-in tool like that is a configuration error, refused.)
func TestUnusableUpstreamToolDoesNotStopStartup(t *testing.T) {
	t.Parallel()
	ok := pep.Tool{Name: "x_fine", Upstream: "x", InputSchema: map[string]any{"type": "object"}}
	bad := pep.Tool{Name: "x_bad", Upstream: "x", InputSchema: map[string]any{"type": "string"}}
	p := newPEP(t, pepOptions{sources: []pep.ToolSource{connecting{pep.StaticTools{bad, ok}}}})
	r, err := p.alice.Call(context.Background(), "tools/list", "", nil)
	require.NoError(t, err)
	require.Contains(t, string(r.Result), `"x_fine"`)
	require.NotContains(t, string(r.Result), `"x_bad"`)
}

// TestAllowedCallOutageIsRetryable: an allowed call that could not run for
// a passing reason answers the retryable -31001, never an internal error or
// a tool error carrying a driver's text (found by the chaos run): an
// upstream that cannot be reached (nothing was sent), and a built-in tool
// whose database cannot be reached (its write did not happen).
func TestAllowedCallOutageIsRetryable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ext := startExt(t)
	p, _ := gatewayPEP(t, ext, 5*time.Second)
	require.NoError(t, ext.http.Close())
	r, err := p.alice.Call(ctx, "tools/call", "ext_lookup", map[string]any{"name": "ext_lookup", "arguments": map[string]any{"q": "x"}})
	require.NoError(t, err)
	require.NotNil(t, r.Error, "%s", r.Raw)
	require.EqualValues(t, tasks.CodeUnavailable, r.Error.Code, "%s", r.Raw)
	require.Contains(t, r.Error.Message, "upstream ext")
	require.Contains(t, r.Error.Message, "did not run")
	require.NotContains(t, string(r.Raw), "127.0.0.1", "not the upstream's address")

	// A built-in tool whose database write fails on a real refused
	// connection.
	flaky := pep.Tool{Name: "flaky_write", Description: "Writes to a database that is down.", InputSchema: map[string]any{"type": "object"},
		Run: func(ctx context.Context, _ pep.Invocation) (pep.Output, error) {
			conn, err := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:1/arap?sslmode=disable&connect_timeout=2")
			if err == nil {
				conn.Close(ctx)
			}
			return pep.Output{Text: "written"}, err
		}}
	// One whose connection is cut mid-statement (its session terminated
	// while the statement runs on the server): the write may have
	// committed, so not "retry", and still no driver text.
	var dsn atomic.Value
	cut := pep.Tool{Name: "cut_write", Description: "Loses its database mid-write.", InputSchema: map[string]any{"type": "object"},
		Run: func(ctx context.Context, x pep.Invocation) (pep.Output, error) {
			conn, err := pgx.Connect(ctx, dsn.Load().(string))
			if err != nil {
				return pep.Output{}, err
			}
			defer conn.Close(ctx)
			pid := conn.PgConn().PID()
			go func() {
				// Once the statement runs on the server, end its session.
				for ctx.Err() == nil {
					var ended bool
					err := x.DB.QueryRow(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
						WHERE pid = $1 AND state = 'active' AND query LIKE 'SELECT pg_sleep%'`, pid).Scan(&ended)
					if err == nil && ended {
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
			}()
			_, err = conn.Exec(ctx, `SELECT pg_sleep(30)`)
			return pep.Output{Text: "written"}, err
		}}
	q := newPEP(t, pepOptions{sources: []pep.ToolSource{pep.StaticTools{flaky, cut}}, policy: []byte(`version: 1
rules:
  - name: flaky
    match: {action: tools/call, resource_type: mcp_tool, resource_id: flaky_write}
    effect: allow
  - name: cut
    match: {action: tools/call, resource_type: mcp_tool, resource_id: cut_write}
    effect: allow
`)})
	dsn.Store(q.db.Config().ConnString())
	r, err = q.alice.Call(ctx, "tools/call", "flaky_write", map[string]any{"name": "flaky_write", "arguments": map[string]any{}})
	require.NoError(t, err)
	require.NotNil(t, r.Error, "%s", r.Raw)
	require.EqualValues(t, tasks.CodeUnavailable, r.Error.Code, "%s", r.Raw)
	require.NotContains(t, string(r.Raw), "127.0.0.1", "not the driver's text")
	require.NotContains(t, string(r.Raw), "postgres")

	r, err = q.alice.Call(ctx, "tools/call", "cut_write", map[string]any{"name": "cut_write", "arguments": map[string]any{}})
	require.NoError(t, err)
	require.Nil(t, r.Error, "not a retryable error: the write may have happened: %s", r.Raw)
	require.Contains(t, string(r.Raw), `"isError":true`)
	require.Contains(t, string(r.Raw), "may or may not")
	require.NotContains(t, string(r.Raw), "127.0.0.1")
	require.NotContains(t, string(r.Raw), "terminat", "not the driver's text")
}
