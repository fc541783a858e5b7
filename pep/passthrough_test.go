package pep_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
	up "github.com/omcp/arap/upstream"
)

// passPolicy allows reading docs:// resources, the greet prompt (except for
// mallory) and completions of prompts; secret:// reads are requestable;
// everything else (private://, other prompts) is denied by default.
const passPolicy = `
version: 1
rules:
  - name: read_docs
    match: {action: resources/read, resource_type: mcp_resource}
    when: resource.id.startsWith("docs://") && resource.properties.upstream == "ext"
    effect: allow
  - name: read_secrets
    match: {action: resources/read, resource_type: mcp_resource}
    when: resource.id.startsWith("secret://")
    effect: request
    template: secret
    approval: {quorum: 1, groups: [platform]}
  - name: greet
    match: {action: prompts/get, resource_type: mcp_prompt, resource_id: ext_greet}
    when: resource.properties.upstream_prompt == "greet" && resource.properties.arguments.who != "mallory"
    effect: allow
  - name: ask
    match: {action: prompts/get, resource_type: mcp_prompt, resource_id: ext_ask}
    effect: allow
  - name: complete_prompts
    match: {action: completion/complete, resource_type: mcp_prompt}
    when: resource.properties.argument.name == "who"
    effect: allow
`

type offerServer struct {
	reads, prompts, completes atomic.Int64
	url                       string
}

// startOffering runs a real go-sdk MCP server (streamable HTTP, stateless)
// on loopback offering resources, a template, prompts and completions, and
// counts what reaches it.
func startOffering(t *testing.T) *offerServer {
	t.Helper()
	o := &offerServer{}
	s := sdk.NewServer(&sdk.Implementation{Name: "ext", Version: "1"}, &sdk.ServerOptions{
		CompletionHandler: func(_ context.Context, req *sdk.CompleteRequest) (*sdk.CompleteResult, error) {
			o.completes.Add(1)
			return &sdk.CompleteResult{Completion: sdk.CompletionResultDetails{Values: []string{req.Params.Argument.Value + "ob"}}}, nil
		},
	})
	read := func(_ context.Context, req *sdk.ReadResourceRequest) (*sdk.ReadResourceResult, error) {
		o.reads.Add(1)
		return &sdk.ReadResourceResult{Contents: []*sdk.ResourceContents{{URI: req.Params.URI, Text: "contents of " + req.Params.URI}}}, nil
	}
	for _, uri := range []string{"docs://readme", "secret://key", "private://diary"} {
		s.AddResource(&sdk.Resource{URI: uri, Name: uri}, read)
	}
	s.AddResourceTemplate(&sdk.ResourceTemplate{URITemplate: "docs://page/{n}", Name: "page"}, read)
	s.AddPrompt(&sdk.Prompt{Name: "greet", Arguments: []*sdk.PromptArgument{{Name: "who"}}},
		func(_ context.Context, req *sdk.GetPromptRequest) (*sdk.GetPromptResult, error) {
			o.prompts.Add(1)
			return &sdk.GetPromptResult{Messages: []*sdk.PromptMessage{{Role: "user", Content: &sdk.TextContent{Text: "hello " + req.Params.Arguments["who"]}}}}, nil
		})
	// ask asks its caller a question first (MRTR, SEP-2322) and answers
	// with what it was told.
	s.AddPrompt(&sdk.Prompt{Name: "ask"}, func(_ context.Context, req *sdk.GetPromptRequest) (*sdk.GetPromptResult, error) {
		o.prompts.Add(1)
		if r, ok := req.Params.InputResponses["q"]; ok {
			raw, _ := json.Marshal(r)
			return &sdk.GetPromptResult{Messages: []*sdk.PromptMessage{{Role: "user", Content: &sdk.TextContent{Text: "told " + string(raw) + " state " + req.Params.RequestState}}}}, nil
		}
		return &sdk.GetPromptResult{RequestState: "st-1", InputRequests: sdk.InputRequestMap{"q": &sdk.ElicitParams{Message: "Which?",
			RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"x": map[string]any{"type": "string"}}}}}}, nil
	})
	s.AddPrompt(&sdk.Prompt{Name: "other"}, func(context.Context, *sdk.GetPromptRequest) (*sdk.GetPromptResult, error) {
		o.prompts.Add(1)
		return &sdk.GetPromptResult{Messages: []*sdk.PromptMessage{{Role: "user", Content: &sdk.TextContent{Text: "other"}}}}, nil
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := &http.Server{Handler: sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, &sdk.StreamableHTTPOptions{Stateless: true})}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	o.url = "http://" + ln.Addr().String() + "/mcp"
	return o
}

func passPEP(t *testing.T, url string, policy string) *stack {
	t.Helper()
	cfg, err := up.Parse("upstreams.yaml", []byte(`
upstreams:
  - name: ext
    http: {url: `+url+`}
    prefix: ext_
`))
	require.NoError(t, err)
	reg := up.New(up.Options{MinBackoff: 50 * time.Millisecond})
	t.Cleanup(func() { _ = reg.Close(context.Background()) })
	require.NoError(t, reg.Reload(context.Background(), cfg))
	require.Eventually(t, func() bool { return reg.Ready()["ext"] == nil }, 30*time.Second, 20*time.Millisecond)
	return newPEP(t, pepOptions{policy: []byte(policy), sources: []pep.ToolSource{pep.NewUpstreams(reg, nil)}, upstreams: reg})
}

func rpc(t *testing.T, p *stack, method, name string, params map[string]any) (json.RawMessage, *tasks.RPCError) {
	t.Helper()
	res, err := p.alice.Call(context.Background(), method, name, params)
	require.NoError(t, err)
	return res.Result, res.Error
}

// TestPassthroughDecidedByPDP: an upstream's resources, templates, prompts
// and completions are advertised and listed; each read, get and complete is
// decided by the PDP and forwarded only when allowed: a denied or
// requestable one is a JSON-RPC error saying so and never reaches the
// upstream.
func TestPassthroughDecidedByPDP(t *testing.T) {
	t.Parallel()
	ext := startOffering(t)
	p := passPEP(t, ext.url, passPolicy)

	res, rerr := rpc(t, p, "server/discover", "", nil)
	require.Nil(t, rerr)
	var disc struct {
		Capabilities map[string]any `json:"capabilities"`
	}
	require.NoError(t, json.Unmarshal(res, &disc))
	for _, c := range []string{"resources", "prompts", "completions", "tools"} {
		require.Contains(t, disc.Capabilities, c, "advertised while an upstream offers it: %s", res)
	}

	res, rerr = rpc(t, p, "resources/list", "", nil)
	require.Nil(t, rerr)
	require.Contains(t, string(res), "docs://readme")
	res, rerr = rpc(t, p, "resources/templates/list", "", nil)
	require.Nil(t, rerr)
	require.Contains(t, string(res), "docs://page/{n}")
	res, rerr = rpc(t, p, "prompts/list", "", nil)
	require.Nil(t, rerr)
	require.Contains(t, string(res), `"ext_greet"`, "prompts under the upstream's prefix")
	require.NotContains(t, string(res), `"greet"`)

	res, rerr = rpc(t, p, "resources/read", "docs://readme", map[string]any{"uri": "docs://readme"})
	require.Nil(t, rerr)
	require.Contains(t, string(res), "contents of docs://readme")
	res, rerr = rpc(t, p, "resources/read", "docs://page/7", map[string]any{"uri": "docs://page/7"})
	require.Nil(t, rerr, "a URI of the upstream's template")
	require.Contains(t, string(res), "contents of docs://page/7")
	require.EqualValues(t, 2, ext.reads.Load())

	_, rerr = rpc(t, p, "resources/read", "private://diary", map[string]any{"uri": "private://diary"})
	require.NotNil(t, rerr, "no rule allows it: denied")
	require.Contains(t, rerr.Message, "Not allowed by policy")
	_, rerr = rpc(t, p, "resources/read", "secret://key", map[string]any{"uri": "secret://key"})
	require.NotNil(t, rerr, "requestable: refused, no approval flow for reads")
	require.Contains(t, rerr.Message, "approvals can only be requested for tool calls")
	_, rerr = rpc(t, p, "resources/read", "nowhere://x", map[string]any{"uri": "nowhere://x"})
	require.NotNil(t, rerr)
	require.EqualValues(t, 2, ext.reads.Load(), "nothing denied or unknown reached the upstream")

	res, rerr = rpc(t, p, "prompts/get", "ext_greet", map[string]any{"name": "ext_greet", "arguments": map[string]any{"who": "bob"}})
	require.Nil(t, rerr)
	require.Contains(t, string(res), "hello bob")
	_, rerr = rpc(t, p, "prompts/get", "ext_greet", map[string]any{"name": "ext_greet", "arguments": map[string]any{"who": "mallory"}})
	require.NotNil(t, rerr, "the arguments are part of the decision")
	_, rerr = rpc(t, p, "prompts/get", "ext_other", map[string]any{"name": "ext_other"})
	require.NotNil(t, rerr, "no rule allows it")
	require.EqualValues(t, 1, ext.prompts.Load())

	// An upstream prompt's question (MRTR) reaches the caller, and the
	// caller's answer the upstream.
	p.alice = &tasks.Client{URL: p.url, Token: aliceToken, Capabilities: map[string]any{"elicitation": map[string]any{}}}
	res, rerr = rpc(t, p, "prompts/get", "ext_ask", map[string]any{"name": "ext_ask"})
	require.Nil(t, rerr)
	var ask struct {
		ResultType    string         `json:"resultType"`
		InputRequests map[string]any `json:"inputRequests"`
		RequestState  string         `json:"requestState"`
	}
	require.NoError(t, json.Unmarshal(res, &ask), "%s", res)
	require.Equal(t, "input_required", ask.ResultType, "%s", res)
	require.Contains(t, ask.InputRequests, "q")
	require.Equal(t, "st-1", ask.RequestState)
	res, rerr = rpc(t, p, "prompts/get", "ext_ask", map[string]any{"name": "ext_ask", "requestState": "st-1",
		"inputResponses": map[string]any{"q": map[string]any{"action": "accept", "content": map[string]any{"x": "y"}}}})
	require.Nil(t, rerr)
	require.Contains(t, string(res), "state st-1")
	require.Contains(t, string(res), `\"content\":{\"x\":\"y\"}`, "the answer reached the upstream")

	complete := func(arg string) (json.RawMessage, *tasks.RPCError) {
		return rpc(t, p, "completion/complete", "", map[string]any{"ref": map[string]any{"type": "ref/prompt", "name": "ext_greet"},
			"argument": map[string]any{"name": arg, "value": "b"}})
	}
	res, rerr = complete("who")
	require.Nil(t, rerr)
	require.Contains(t, string(res), `"bob"`)
	_, rerr = complete("other")
	require.NotNil(t, rerr)
	require.EqualValues(t, 1, ext.completes.Load())
}

// TestPassthroughNotOffered: with an upstream that offers only tools,
// resources, prompts, completions and logging are neither advertised nor
// served.
func TestPassthroughNotOffered(t *testing.T) {
	t.Parallel()
	ext := startExt(t)
	p := passPEP(t, ext.url, gatewayPolicy)
	res, rerr := rpc(t, p, "server/discover", "", nil)
	require.Nil(t, rerr)
	var disc struct {
		Capabilities map[string]any `json:"capabilities"`
	}
	require.NoError(t, json.Unmarshal(res, &disc))
	require.Contains(t, disc.Capabilities, "tools")
	for _, c := range []string{"resources", "prompts", "completions", "logging"} {
		require.NotContains(t, disc.Capabilities, c, "%s", res)
	}
	for _, m := range []string{"resources/list", "prompts/list", "completion/complete"} {
		_, rerr = rpc(t, p, m, "", nil)
		require.NotNil(t, rerr, m)
		require.EqualValues(t, jsonrpc.CodeMethodNotFound, rerr.Code, m)
	}
}
