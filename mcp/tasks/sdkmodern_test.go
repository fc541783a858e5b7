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

// TestSDKReadsRequestMetaOnce holds the third change of
// third_party/README.md: at 2026-07-28 the SDK decoded each request's
// _meta into maps for three readers (the version check, the per-request
// initialize params, the Mcp-Name check) and encoded and decoded its typed
// values again: 49 KB allocated per tools/call unpatched, 28 KB patched.
// Bytes allocated are counted, not timed.
func TestSDKReadsRequestMetaOnce(t *testing.T) {
	call := sdkToolsCallModern(t)
	call()
	const n = 200
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range n {
		call()
	}
	runtime.ReadMemStats(&after)
	perCall := (after.TotalAlloc - before.TotalAlloc) / n
	t.Logf("%d bytes allocated per tools/call at 2026-07-28", perCall)
	require.Less(t, perCall, uint64(40<<10), "the SDK decodes each request's _meta into maps again: is third_party/go-sdk's patch applied (go.mod's replace)?")
}

// BenchmarkSDKToolsCallModern is BenchmarkSDKToolsCall at the protocol
// revision arapd mcp speaks (2026-07-28: the version, capabilities and
// client in each request's _meta, the Mcp-Method and Mcp-Name headers), a
// tool with an input schema, and the server's capabilities as arapd mcp
// declares them.
func BenchmarkSDKToolsCallModern(b *testing.B) {
	call := sdkToolsCallModern(b)
	b.ReportAllocs()
	for b.Loop() {
		call()
	}
}

func sdkToolsCallModern(t testing.TB) func() {
	s := sdk.NewServer(&sdk.Implementation{Name: "t", Version: "0"}, &sdk.ServerOptions{
		Capabilities: &sdk.ServerCapabilities{Tools: &sdk.ToolCapabilities{}, Extensions: map[string]any{tasks.ExtensionID: map[string]any{}}},
	})
	s.AddTool(&sdk.Tool{Name: "echo", InputSchema: map[string]any{"type": "object", "properties": map[string]any{
		"to": map[string]any{"type": "string"}, "amount": map[string]any{"type": "number"}}}},
		func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "ok"}}}, nil
		})
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, &sdk.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	const body = `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"to":"acct-1","amount":50000},` +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}},` +
		`"io.modelcontextprotocol/clientInfo":{"name":"arap-tasks-client","version":"0.1.0"}}}}`
	return func() {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Accept", "application/json, text/event-stream")
		r.Header.Set("Mcp-Protocol-Version", "2026-07-28")
		r.Header.Set("Mcp-Method", "tools/call")
		r.Header.Set("Mcp-Name", "echo")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		require.Equal(t, http.StatusOK, w.Code, w.Body.String())
		require.Contains(t, w.Body.String(), `"text":"ok"`)
	}
}
