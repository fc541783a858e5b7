package pep_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
	up "github.com/omcp/arap/upstream"
)

// relayPolicy allows the upstream's read-only tools, its docs:// resources
// and its greet prompt, whichever upstream offers them; a destructive tool
// needs one approval.
const relayPolicy = `
version: 1
rules:
  - name: read_only
    match: {action: tools/call, resource_type: mcp_tool}
    when: has(resource.properties.annotations) && has(resource.properties.annotations.readOnlyHint) && resource.properties.annotations.readOnlyHint == true
    effect: allow
  - name: destructive
    match: {action: tools/call, resource_type: mcp_tool}
    when: has(resource.properties.annotations) && has(resource.properties.annotations.destructiveHint) && resource.properties.annotations.destructiveHint == true
    effect: request
    template: destructive
    approval: {quorum: 1, groups: [platform], kinds: [itsm]}
  - name: read_docs
    match: {action: resources/read, resource_type: mcp_resource}
    when: resource.id.startsWith("docs://")
    effect: allow
  - name: greet
    match: {action: prompts/get, resource_type: mcp_prompt}
    effect: allow
`

// askFirstRule makes ext_ask need an approval with a justification the gate
// asks for first (its own MRTR round); placed before relayPolicy's rules.
const askFirstRule = `
  - name: ask_needs_justification
    match: {action: tools/call, resource_type: mcp_tool, resource_id: ext_ask}
    effect: request
    template: justified
    approval: {quorum: 1, groups: [platform], kinds: [itsm]}
    request_schema:
      type: object
      required: [context]
      properties:
        context:
          type: object
          required: [justification]
          properties:
            justification: {type: string, minLength: 3}
`

// chatty is a real go-sdk MCP server (streamable HTTP, 2026-07-28) on
// loopback whose tools, resource and prompt report progress and log while
// they run, and whose ask tools ask their caller first (MRTR).
type chatty struct {
	name string
	url  string
	http *http.Server
	// seen is closed by the test's client once the relayed progress has
	// reached it: a tool that reports progress waits for it, so the
	// notification is on the stream before the result.
	seen     chan struct{}
	seenOnce sync.Once
	asks     atomic.Int64 // runs of ask and purge_ask
	works    atomic.Int64
	reads    atomic.Int64
	// tokens are the progress tokens the upstream was given.
	tokens sync.Map
}

func startChatty(t *testing.T, name string) *chatty {
	t.Helper()
	c := &chatty{name: name, seen: make(chan struct{})}
	s := sdk.NewServer(&sdk.Implementation{Name: name, Version: "1"}, nil)
	type in struct {
		Q string `json:"q"`
	}
	report := func(ctx context.Context, sess *sdk.ServerSession, tok any, what string) {
		_ = sess.Log(ctx, &sdk.LoggingMessageParams{Level: "info", Logger: name, Data: what + " step one"})
		_ = sess.Log(ctx, &sdk.LoggingMessageParams{Level: "debug", Logger: name, Data: what + " chatter"})
		if tok == nil {
			return
		}
		c.tokens.Store(fmt.Sprint(tok), true)
		_ = sess.NotifyProgress(ctx, &sdk.ProgressNotificationParams{ProgressToken: tok, Progress: 1, Total: 2, Message: what + " half"})
		wait, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		select {
		case <-c.seen:
		case <-wait.Done():
		}
	}
	sdk.AddTool(s, &sdk.Tool{Name: "work", Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, req *sdk.CallToolRequest, a in) (*sdk.CallToolResult, any, error) {
			c.works.Add(1)
			report(ctx, req.Session, req.Params.GetProgressToken(), "work")
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: name + " worked"}}}, nil, nil
		})
	ask := func(_ context.Context, req *sdk.CallToolRequest, _ in) (*sdk.CallToolResult, any, error) {
		c.asks.Add(1)
		if r, ok := req.Params.InputResponses["q"].(*sdk.ElicitResult); ok {
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{
				Text: fmt.Sprintf("%s told %s %v state %s", name, r.Action, r.Content["x"], req.Params.RequestState)}}}, nil, nil
		}
		return &sdk.CallToolResult{RequestState: name + "-state-1", InputRequests: sdk.InputRequestMap{"q": &sdk.ElicitParams{Mode: "form", Message: "Which?",
			RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"x": map[string]any{"type": "string"}}}}}}, nil, nil
	}
	sdk.AddTool(s, &sdk.Tool{Name: "ask", Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true}}, ask)
	yes := true
	sdk.AddTool(s, &sdk.Tool{Name: "purge_ask", Annotations: &sdk.ToolAnnotations{DestructiveHint: &yes}}, ask)
	s.AddResource(&sdk.Resource{URI: "docs://readme", Name: "readme"}, func(ctx context.Context, req *sdk.ReadResourceRequest) (*sdk.ReadResourceResult, error) {
		c.reads.Add(1)
		report(ctx, req.Session, req.Params.GetProgressToken(), "read")
		return &sdk.ReadResourceResult{Contents: []*sdk.ResourceContents{{URI: req.Params.URI, Text: name + " readme"}}}, nil
	})
	s.AddPrompt(&sdk.Prompt{Name: "greet"}, func(ctx context.Context, req *sdk.GetPromptRequest) (*sdk.GetPromptResult, error) {
		report(ctx, req.Session, req.Params.GetProgressToken(), "prompt")
		return &sdk.GetPromptResult{Messages: []*sdk.PromptMessage{{Role: "user", Content: &sdk.TextContent{Text: "hello"}}}}, nil
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	c.http = &http.Server{Handler: sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, &sdk.StreamableHTTPOptions{Stateless: true})}
	go func() { _ = c.http.Serve(ln) }()
	t.Cleanup(func() { _ = c.http.Close() })
	c.url = "http://" + ln.Addr().String() + "/mcp"
	return c
}

// upstreamsFile is an upstreams file with each server under prefix ext_.
func upstreamsFile(t *testing.T, servers ...*chatty) *up.Config {
	t.Helper()
	var b strings.Builder
	b.WriteString("upstreams:\n")
	for _, c := range servers {
		fmt.Fprintf(&b, "  - name: %s\n    http: {url: %s}\n    prefix: ext_\n", c.name, c.url)
	}
	cfg, err := up.Parse("upstreams.yaml", []byte(b.String()))
	require.NoError(t, err)
	return cfg
}

// relayPEP is the real gate in front of ext through a real registry, with
// its resources and prompts passed through; log collects what the gate
// and the server log.
func relayPEP(t *testing.T, ext *chatty, policy string, log io.Writer) (*stack, *up.Registry) {
	t.Helper()
	reg := up.New(up.Options{MinBackoff: 50 * time.Millisecond})
	t.Cleanup(func() { _ = reg.Close(context.Background()) })
	require.NoError(t, reg.Reload(context.Background(), upstreamsFile(t, ext)))
	require.Eventually(t, func() bool { return len(reg.Tools()) == 3 }, 30*time.Second, 20*time.Millisecond)
	o := pepOptions{policy: []byte(policy), sources: []pep.ToolSource{pep.NewUpstreams(reg, nil)}, upstreams: reg}
	if log != nil {
		o.log = slog.New(slog.NewJSONHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return newPEP(t, o), reg
}

// watching is a client whose HTTP transport closes ext.seen as soon as a
// progress notification arrives on a response stream.
func watching(p *stack, ext *chatty, caps map[string]any) *tasks.Client {
	return &tasks.Client{URL: p.url, Token: aliceToken, Capabilities: caps, HTTP: &http.Client{Timeout: time.Minute, Transport: watcher{ext}}}
}

type watcher struct{ ext *chatty }

func (w watcher) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err == nil {
		resp.Body = &watchBody{ReadCloser: resp.Body, ext: w.ext}
	}
	return resp, err
}

type watchBody struct {
	io.ReadCloser
	ext *chatty
	buf []byte
}

func (b *watchBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.buf = append(b.buf, p[:n]...)
	if bytes.Contains(b.buf, []byte("notifications/progress")) {
		b.ext.seenOnce.Do(func() { close(b.ext.seen) })
	}
	return n, err
}

// notifications are the JSON-RPC notifications of an SSE response body, by
// method.
func notifications(t *testing.T, raw []byte) map[string][]map[string]any {
	t.Helper()
	out := map[string][]map[string]any{}
	for _, line := range bytes.Split(raw, []byte("\n")) {
		d, ok := bytes.CutPrefix(line, []byte("data: "))
		if !ok {
			continue
		}
		var m struct {
			ID     any            `json:"id"`
			Method string         `json:"method"`
			Params map[string]any `json:"params"`
		}
		require.NoError(t, json.Unmarshal(d, &m))
		if m.Method != "" && m.ID == nil {
			out[m.Method] = append(out[m.Method], m.Params)
		}
	}
	return out
}

// TestUpstreamProgressAndLogsRelayed: a tools/call the policy allows at once
// that carries a progressToken gets the upstream's progress on its own
// stream, under the client's token (the upstream saw the gateway's); with a
// log level it gets the upstream's log messages at that level, and none
// without one. Nothing of them, nor the arguments, is in the gateway's log.
func TestUpstreamProgressAndLogsRelayed(t *testing.T) {
	t.Parallel()
	ext := startChatty(t, "ext")
	var logs syncBuffer
	p, _ := relayPEP(t, ext, relayPolicy, &logs)
	ctx := context.Background()
	c := watching(p, ext, nil)
	disc, err := c.Call(ctx, "server/discover", "", nil)
	require.NoError(t, err)
	require.Contains(t, string(disc.Result), `"logging":{}`, "an HTTP upstream offers logging, so the gateway does")

	r, err := c.Call(ctx, "tools/call", "ext_work", map[string]any{"name": "ext_work", "arguments": map[string]any{"q": "arg-7f3a91"},
		"_meta": map[string]any{"progressToken": "client-tok-7", sdk.MetaKeyLogLevel: "info"}})
	require.NoError(t, err)
	require.Nil(t, r.Error)
	require.Contains(t, string(r.Result), "ext worked")
	n := notifications(t, r.Raw)
	require.Len(t, n["notifications/progress"], 1, "%s", r.Raw)
	prog := n["notifications/progress"][0]
	require.Equal(t, "client-tok-7", prog["progressToken"], "the client's own token")
	require.Equal(t, "work half", prog["message"])
	require.EqualValues(t, 1, prog["progress"])
	var upTok string
	ext.tokens.Range(func(k, _ any) bool { upTok = k.(string); return false })
	require.NotEmpty(t, upTok)
	require.NotEqual(t, "client-tok-7", upTok, "the upstream never sees the client's token")
	require.NotContains(t, string(r.Raw), upTok, "nor does the client see the gateway's")
	require.Len(t, n["notifications/message"], 1, "info, not debug: %s", r.Raw)
	require.Equal(t, "work step one", n["notifications/message"][0]["data"])

	// No log level: no log messages (progress still comes).
	r, err = c.Call(ctx, "tools/call", "ext_work", map[string]any{"name": "ext_work", "arguments": map[string]any{"q": "arg-7f3a91"},
		"_meta": map[string]any{"progressToken": 8}})
	require.NoError(t, err)
	n = notifications(t, r.Raw)
	require.Empty(t, n["notifications/message"], "%s", r.Raw)
	require.Len(t, n["notifications/progress"], 1)
	require.EqualValues(t, 8, n["notifications/progress"][0]["progressToken"], "a number token stays a number")

	// A log level alone opens a stream for the log messages.
	r, err = c.Call(ctx, "tools/call", "ext_work", map[string]any{"name": "ext_work", "arguments": map[string]any{"q": "arg-7f3a91"},
		"_meta": map[string]any{sdk.MetaKeyLogLevel: "debug"}})
	require.NoError(t, err)
	n = notifications(t, r.Raw)
	require.Len(t, n["notifications/message"], 2, "debug asked: both: %s", r.Raw)
	require.Empty(t, n["notifications/progress"], "no token: no progress")

	require.EqualValues(t, 3, ext.works.Load())
	for _, secret := range []string{"arg-7f3a91", "step one", "work half"} {
		require.NotContains(t, logs.String(), secret, "the gateway's own log holds no arguments and no relayed content")
	}
}

// TestPassthroughProgressAndLogsRelayed: resources/read and prompts/get
// get the upstream's progress (under the client's token) and log messages
// on their stream, and count in the upstream metric like tool calls.
func TestPassthroughProgressAndLogsRelayed(t *testing.T) {
	t.Parallel()
	ext := startChatty(t, "ext")
	p, _ := relayPEP(t, ext, relayPolicy, nil)
	ctx := context.Background()
	c := watching(p, ext, nil)

	r, err := c.Call(ctx, "resources/read", "docs://readme", map[string]any{"uri": "docs://readme",
		"_meta": map[string]any{"progressToken": "read-tok", sdk.MetaKeyLogLevel: "info"}})
	require.NoError(t, err)
	require.Nil(t, r.Error)
	require.Contains(t, string(r.Result), "ext readme")
	n := notifications(t, r.Raw)
	require.Len(t, n["notifications/progress"], 1, "%s", r.Raw)
	require.Equal(t, "read-tok", n["notifications/progress"][0]["progressToken"])
	require.Equal(t, "read half", n["notifications/progress"][0]["message"])
	require.Len(t, n["notifications/message"], 1)
	require.Equal(t, "read step one", n["notifications/message"][0]["data"])

	r, err = c.Call(ctx, "prompts/get", "ext_greet", map[string]any{"name": "ext_greet",
		"_meta": map[string]any{"progressToken": "prompt-tok", sdk.MetaKeyLogLevel: "info"}})
	require.NoError(t, err)
	require.Nil(t, r.Error)
	n = notifications(t, r.Raw)
	require.Len(t, n["notifications/progress"], 1, "%s", r.Raw)
	require.Equal(t, "prompt-tok", n["notifications/progress"][0]["progressToken"])
	require.Len(t, n["notifications/message"], 1)
	require.Equal(t, "prompt step one", n["notifications/message"][0]["data"])

	_, rerr := rpc(t, p, "resources/read", "docs://nothing", map[string]any{"uri": "docs://nothing"})
	require.NotNil(t, rerr, "allowed, but no upstream offers it")
	metrics := scrape(t, p)
	require.Contains(t, metrics, `arap_pep_upstream_request_duration_seconds_count{upstream="ext"} 2`, "both forwards observed, the unknown URI never forwarded")
}

func scrape(t *testing.T, p *stack) string {
	t.Helper()
	resp, err := http.Get(p.server + pep.PathMetrics)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// TestUpstreamInputRelayed: an allowed tools/call whose upstream asks for
// input (MRTR input_required) gets the upstream's questions and a
// requestState of the gateway's (sealed: the upstream's state is not in it
// in clear); the client's retry is decided again and goes back to the same
// upstream with the upstream's requestState and the client's answers. A
// requestState tampered with, or replayed for another principal, tool or
// arguments, or used twice, is a JSON-RPC error and changes nothing.
func TestUpstreamInputRelayed(t *testing.T) {
	t.Parallel()
	ext := startChatty(t, "ext")
	p, _ := relayPEP(t, ext, relayPolicy, nil)
	ctx := context.Background()
	require.NoError(t, p.gate.Callers().Create(ctx, "bob-agent", "bob-token-0123", pep.Principal{SubjectType: "user", SubjectID: "bob", ActorID: "agent:x"}))
	caps := map[string]any{"elicitation": map[string]any{"form": map[string]any{}}}
	alice := &tasks.Client{URL: p.url, Token: aliceToken, Capabilities: caps}
	bob := &tasks.Client{URL: p.url, Token: "bob-token-0123", Capabilities: caps}
	args := map[string]any{"q": "a"}

	r, err := alice.CallTool(ctx, "ext_ask", args, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeInputRequired, r.ResultType, "%s", r.Raw)
	require.Contains(t, r.InputRequests, "q", "the upstream's question, as it asked it")
	require.Contains(t, string(r.Raw), "Which?")
	require.NotEmpty(t, r.RequestState)
	require.NotContains(t, string(r.Raw), "ext-state-1", "the upstream's state travels sealed")
	require.EqualValues(t, 1, ext.asks.Load())
	answer := map[string]any{"q": map[string]any{"action": "accept", "content": map[string]any{"x": "y"}}}
	retry := func(c *tasks.Client, tool string, args map[string]any, state string) (*tasks.CallResult, error) {
		return c.CallTool(ctx, tool, args, map[string]any{"requestState": state, "inputResponses": answer})
	}

	tampered := []byte(r.RequestState)
	tampered[len(tampered)/2] ^= 'A' ^ 'B'
	for name, try := range map[string]func() (*tasks.CallResult, error){
		"tampered":     func() (*tasks.CallResult, error) { return retry(alice, "ext_ask", args, string(tampered)) },
		"not ours":     func() (*tasks.CallResult, error) { return retry(alice, "ext_ask", args, "ext-state-1") },
		"other caller": func() (*tasks.CallResult, error) { return retry(bob, "ext_ask", args, r.RequestState) },
		"other tool":   func() (*tasks.CallResult, error) { return retry(alice, "ext_work", args, r.RequestState) },
		"other argument": func() (*tasks.CallResult, error) {
			return retry(alice, "ext_ask", map[string]any{"q": "b"}, r.RequestState)
		},
	} {
		_, err := try()
		var rerr *tasks.RPCError
		require.ErrorAs(t, err, &rerr, name)
		require.EqualValues(t, -32602, rerr.Code, name)
	}
	require.EqualValues(t, 1, ext.asks.Load(), "no refused retry reached the upstream")
	require.Zero(t, ext.works.Load())

	// The real retry still works: the refusals used nothing up.
	done, err := retry(alice, "ext_ask", args, r.RequestState)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeComplete, done.ResultType, "%s", done.Raw)
	require.Contains(t, string(done.Raw), "ext told accept y state ext-state-1", "the upstream got its own state and the client's answers")
	require.EqualValues(t, 2, ext.asks.Load())

	_, err = retry(alice, "ext_ask", args, r.RequestState)
	var rerr *tasks.RPCError
	require.ErrorAs(t, err, &rerr, "single use")
	require.Contains(t, rerr.Message, "already used")
	require.EqualValues(t, 2, ext.asks.Load())
}

// TestUpstreamInputBoundToUpstream: a requestState the gateway relayed for
// one upstream is refused once the tool's name belongs to another upstream
// (a reload in between): the answers never reach a server that did not ask.
func TestUpstreamInputBoundToUpstream(t *testing.T) {
	t.Parallel()
	ext, other := startChatty(t, "ext"), startChatty(t, "other")
	p, reg := relayPEP(t, ext, relayPolicy, nil)
	ctx := context.Background()
	alice := &tasks.Client{URL: p.url, Token: aliceToken, Capabilities: map[string]any{"elicitation": map[string]any{}}}
	r, err := alice.CallTool(ctx, "ext_ask", map[string]any{"q": "a"}, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeInputRequired, r.ResultType)

	require.NoError(t, reg.Reload(ctx, upstreamsFile(t, other)))
	require.Eventually(t, func() bool {
		for _, tl := range reg.Tools() {
			if tl.Name == "ext_ask" && tl.Upstream == "other" {
				return true
			}
		}
		return false
	}, 30*time.Second, 20*time.Millisecond)
	_, err = alice.CallTool(ctx, "ext_ask", map[string]any{"q": "a"}, map[string]any{"requestState": r.RequestState,
		"inputResponses": map[string]any{"q": map[string]any{"action": "accept", "content": map[string]any{"x": "y"}}}})
	var rerr *tasks.RPCError
	require.ErrorAs(t, err, &rerr)
	require.EqualValues(t, -32602, rerr.Code)
	require.Contains(t, rerr.Message, "another upstream")
	require.Zero(t, other.asks.Load(), "nothing reached the other upstream")
}

// TestGateAndUpstreamInputCompose: the gate asks first (the approval needs
// a justification), the policy then allows the call, and the upstream asks
// in turn: both rounds work, each with its own requestState.
func TestGateAndUpstreamInputCompose(t *testing.T) {
	t.Parallel()
	ext := startChatty(t, "ext")
	policy := strings.Replace(relayPolicy, "rules:\n", "rules:\n"+strings.TrimPrefix(askFirstRule, "\n"), 1)
	p, _ := relayPEP(t, ext, policy, nil)
	ctx := context.Background()
	alice := &tasks.Client{URL: p.url, Token: aliceToken, Capabilities: map[string]any{"elicitation": map[string]any{},
		"extensions": map[string]any{tasks.ExtensionID: map[string]any{}}}}
	args := map[string]any{"q": "a"}

	gate, err := alice.CallTool(ctx, "ext_ask", args, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeInputRequired, gate.ResultType, "%s", gate.Raw)
	require.Contains(t, string(gate.Raw), "justification", "the gate's own question")
	require.Zero(t, ext.asks.Load())
	var key string
	for k := range gate.InputRequests {
		key = k
	}

	// The policy changes: the call is allowed as it is.
	require.NoError(t, os.WriteFile(p.env.PolicyFile, []byte(relayPolicy), 0o600))
	require.NoError(t, p.env.Backend.Reload())

	upr, err := alice.CallTool(ctx, "ext_ask", args, map[string]any{"requestState": gate.RequestState,
		"inputResponses": map[string]any{key: map[string]any{"action": "accept", "content": map[string]any{"justification": "needed for the audit"}}}})
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeInputRequired, upr.ResultType, "%s", upr.Raw)
	require.Contains(t, upr.InputRequests, "q", "now the upstream's question")
	require.NotEqual(t, gate.RequestState, upr.RequestState)
	require.EqualValues(t, 1, ext.asks.Load())

	done, err := alice.CallTool(ctx, "ext_ask", args, map[string]any{"requestState": upr.RequestState,
		"inputResponses": map[string]any{"q": map[string]any{"action": "accept", "content": map[string]any{"x": "z"}}}})
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeComplete, done.ResultType, "%s", done.Raw)
	require.Contains(t, string(done.Raw), "ext told accept z state ext-state-1")
}

// TestUpstreamInputInApprovedTask: an approved task whose upstream asks for
// input cannot relay the question (the run is one claimed call); the task
// ends at once with a result that says so and that the call may have had
// effects, never waiting.
func TestUpstreamInputInApprovedTask(t *testing.T) {
	t.Parallel()
	ext := startChatty(t, "ext")
	p, _ := relayPEP(t, ext, relayPolicy, nil)
	ctx := context.Background()
	r, err := p.alice.CallTool(ctx, "ext_purge_ask", map[string]any{"q": "all"}, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeTask, r.ResultType, "%s", r.Raw)
	id := r.Task.TaskID
	p.approve(t, p.request(t, id), time.Now().Add(time.Hour))
	p.advance(t, id)
	d := p.get(t, id)
	require.Equal(t, "execution-error", disposition(t, d), "%s", d.Result)
	require.Contains(t, string(d.Result), "asked for more input")
	require.Contains(t, string(d.Result), "cannot relay")
	require.Contains(t, string(d.Result), "may have had effects")
	require.EqualValues(t, 1, ext.asks.Load(), "forwarded once, never again")
	p.advance(t, id)
	require.EqualValues(t, 1, ext.asks.Load())
}

// TestPassthroughForwardsWhereDecided: a reload between the PDP's decision
// and the forward that gives the resource to another upstream does not send
// the read there: decided for one upstream, sent to it or nowhere.
func TestPassthroughForwardsWhereDecided(t *testing.T) {
	t.Parallel()
	ext, other := startChatty(t, "ext"), startChatty(t, "other")
	p, reg := relayPEP(t, ext, relayPolicy, nil)
	cfg := upstreamsFile(t, other)
	var once sync.Once
	p.onBackend(func(r *http.Request, body []byte) {
		if r.URL.Path != authzen.PathEvaluation || !bytes.Contains(body, []byte(pep.ActionReadResource)) {
			return
		}
		once.Do(func() {
			// After the decision is asked for, before the forward. (Not on
			// the test's goroutine: errors only, no FailNow.)
			if err := reg.Reload(context.Background(), cfg); err != nil {
				t.Error(err)
			}
			for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
				if o, ok := reg.ResourceOwner("docs://readme"); ok && o == "other" {
					return
				}
			}
			t.Error("the reload did not give docs://readme to the other upstream")
		})
	})
	_, rerr := rpc(t, p, "resources/read", "docs://readme", map[string]any{"uri": "docs://readme"})
	require.NotNil(t, rerr, "the upstream decided on no longer offers it")
	require.Contains(t, rerr.Message, "not sent")
	require.Zero(t, other.reads.Load(), "never sent to an upstream the PDP did not decide on")
	require.Zero(t, ext.reads.Load())
}

// syncBuffer is a bytes.Buffer safe for concurrent writers (a logger).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestDegradedSaysWhy: a requestable call from a client that cannot wait
// for a task gets the degraded result, and it names the reason that
// applies: a 2026-07-28 client that did not declare the tasks extension, or
// a 2025-11-25 session, which cannot declare it on a request at all.
func TestDegradedSaysWhy(t *testing.T) {
	t.Parallel()
	p := newPEP(t, pepOptions{})
	ctx := context.Background()
	plain := &tasks.Client{URL: p.url, Token: aliceToken, NoTasks: true}
	r, err := plain.CallTool(ctx, "wire_transfer", map[string]any{"to": "x", "amount": 90000}, nil)
	require.NoError(t, err)
	require.True(t, r.IsError)
	require.Contains(t, string(r.Raw), "did not run")
	require.Contains(t, string(r.Raw), "did not declare the tasks extension")
	require.NotContains(t, string(r.Raw), "2025-11-25")

	// A 2025-11-25 client: no per-request _meta, the version in the header.
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"wire_transfer","arguments":{"to":"x","amount":90000}}}`
	req, err := http.NewRequest(http.MethodPost, p.url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+aliceToken)
	req.Header.Set(tasks.HeaderProtocolVersion, "2025-11-25")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
	require.Contains(t, string(raw), `"isError":true`, "%s", raw)
	require.Contains(t, string(raw), "did not run")
	require.Contains(t, string(raw), "Your client speaks MCP 2025-11-25, which cannot use the tasks extension")
	require.NotContains(t, string(raw), "did not declare")

	// A 2025-11-25 request whose _meta claims the extension anyway is not
	// offered a task: the revision cannot use it.
	body = `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"wire_transfer","arguments":{"to":"x","amount":90000},` +
		`"_meta":{"` + tasks.MetaClientCapabilities + `":{"extensions":{"` + tasks.ExtensionID + `":{}}}}}}`
	req, err = http.NewRequest(http.MethodPost, p.url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header = req0Header(aliceToken)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	raw, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Contains(t, string(raw), "Your client speaks MCP 2025-11-25, which cannot use the tasks extension", "%s", raw)

	var n int
	require.NoError(t, p.db.QueryRow(ctx, `SELECT count(*) FROM pep.approval_tasks`).Scan(&n))
	require.Zero(t, n, "nothing submitted on the degraded path")
}

// req0Header is the headers of a 2025-11-25 request of the caller token.
func req0Header(token string) http.Header {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("Accept", "application/json, text/event-stream")
	h.Set("Authorization", "Bearer "+token)
	h.Set(tasks.HeaderProtocolVersion, "2025-11-25")
	return h
}

// TestUpstreamInputRetryDecidedAgain: the retry of a relayed upstream
// question is decided by the PDP again; one the policy no longer allows is
// not forwarded.
func TestUpstreamInputRetryDecidedAgain(t *testing.T) {
	t.Parallel()
	ext := startChatty(t, "ext")
	p, _ := relayPEP(t, ext, relayPolicy, nil)
	ctx := context.Background()
	alice := &tasks.Client{URL: p.url, Token: aliceToken, Capabilities: map[string]any{"elicitation": map[string]any{}}}
	r, err := alice.CallTool(ctx, "ext_ask", map[string]any{"q": "a"}, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeInputRequired, r.ResultType)

	require.NoError(t, os.WriteFile(p.env.PolicyFile, []byte("version: 1\nrules: []\n"), 0o600))
	require.NoError(t, p.env.Backend.Reload())
	res, err := alice.CallTool(ctx, "ext_ask", map[string]any{"q": "a"}, map[string]any{"requestState": r.RequestState,
		"inputResponses": map[string]any{"q": map[string]any{"action": "accept", "content": map[string]any{"x": "y"}}}})
	require.NoError(t, err)
	require.True(t, res.IsError, "%s", res.Raw)
	require.Contains(t, string(res.Raw), "no longer allowed by policy")
	require.EqualValues(t, 1, ext.asks.Load(), "the answers were not forwarded")
}
