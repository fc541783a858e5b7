package tasks_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/mcp/tasks"
)

// TestSDKDecodesWithoutReadBuffers holds the go-sdk patch of
// third_party/README.md: the SDK decodes a request five or six times, and
// unpatched each decode allocated a 32 KB read buffer. Bytes allocated are
// counted, not timed, so a loaded machine does not move the figure.
func TestSDKDecodesWithoutReadBuffers(t *testing.T) {
	perCall := allocatedPerCall(sdkToolsCall(t))
	t.Logf("%d bytes allocated per tools/call", perCall)
	require.Less(t, perCall, uint64(100<<10), "the SDK allocates a read buffer per decode again: is third_party/go-sdk's patch applied (go.mod's replace)?")
}

// TestSDKReadsRequestMetaOnce holds the third change of
// third_party/README.md: at 2026-07-28 the SDK decoded each request's
// _meta into maps for three readers (the version check, the per-request
// initialize params, the Mcp-Name check) and encoded and decoded its typed
// values again: 49 KB allocated per tools/call unpatched, 28 KB patched.
func TestSDKReadsRequestMetaOnce(t *testing.T) {
	perCall := allocatedPerCall(sdkToolsCallModern(t))
	t.Logf("%d bytes allocated per tools/call at 2026-07-28", perCall)
	require.Less(t, perCall, uint64(40<<10), "the SDK decodes each request's _meta into maps again: is third_party/go-sdk's patch applied (go.mod's replace)?")
}

// BenchmarkSDKToolsCall is the SDK's share of a tools/call in arapd mcp's
// server, with the garbage collection of what it allocates (figures in
// docs/performance.md).
func BenchmarkSDKToolsCall(b *testing.B) { benchmarkCalls(b, sdkToolsCall(b)) }

// BenchmarkSDKToolsCallModern is BenchmarkSDKToolsCall at the protocol
// revision arapd mcp speaks (2026-07-28: the version, capabilities and
// client in each request's _meta, the Mcp-Method and Mcp-Name headers), a
// tool with an input schema, and the server's capabilities as arapd mcp
// declares them.
func BenchmarkSDKToolsCallModern(b *testing.B) { benchmarkCalls(b, sdkToolsCallModern(b)) }

func benchmarkCalls(b *testing.B, call func()) {
	b.ReportAllocs()
	for b.Loop() {
		call()
	}
}

// allocatedPerCall is the bytes call allocates, averaged over 200 calls
// after a first one.
func allocatedPerCall(call func()) uint64 {
	call()
	const n = 200
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range n {
		call()
	}
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / n
}

// sdkToolsCall returns a function that makes one tools/call of a trivial
// tool through the SDK's stateless streamable handler, as arapd mcp runs it.
func sdkToolsCall(t testing.TB) func() {
	return sdkCaller(t, nil, map[string]any{"type": "object"},
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"to":"acct-1","amount":50000}}}`,
		map[string]string{"Mcp-Protocol-Version": "2025-11-25"})
}

func sdkToolsCallModern(t testing.TB) func() {
	return sdkCaller(t,
		&sdk.ServerOptions{Capabilities: &sdk.ServerCapabilities{Tools: &sdk.ToolCapabilities{}, Extensions: map[string]any{tasks.ExtensionID: map[string]any{}}}},
		map[string]any{"type": "object", "properties": map[string]any{
			"to": map[string]any{"type": "string"}, "amount": map[string]any{"type": "number"}}},
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"to":"acct-1","amount":50000},`+
			`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}},`+
			`"io.modelcontextprotocol/clientInfo":{"name":"arap-tasks-client","version":"0.1.0"}}}}`,
		map[string]string{"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "echo"})
}

// sdkCaller returns a function that posts body (a tools/call of the tool
// "echo" with the given input schema) with headers to a stateless server
// made with opts, and checks the tool answered.
func sdkCaller(t testing.TB, opts *sdk.ServerOptions, schema map[string]any, body string, headers map[string]string) func() {
	s := sdk.NewServer(&sdk.Implementation{Name: "t", Version: "0"}, opts)
	s.AddTool(&sdk.Tool{Name: "echo", InputSchema: schema},
		func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "ok"}}}, nil
		})
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, &sdk.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	return func() {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Accept", "application/json, text/event-stream")
		for k, v := range headers {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		require.Equal(t, http.StatusOK, w.Code, w.Body.String())
		require.Contains(t, w.Body.String(), `"text":"ok"`)
	}
}
