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
)

// TestSDKDecodesWithoutReadBuffers holds the go-sdk patch of
// third_party/README.md: the SDK decodes a request five or six times, and
// unpatched each decode allocated a 32 KB read buffer. Bytes allocated are
// counted, not timed, so a loaded machine does not move the figure.
func TestSDKDecodesWithoutReadBuffers(t *testing.T) {
	call := sdkToolsCall(t)
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
	t.Logf("%d bytes allocated per tools/call", perCall)
	require.Less(t, perCall, uint64(100<<10), "the SDK allocates a read buffer per decode again: is third_party/go-sdk's patch applied (go.mod's replace)?")
}

// BenchmarkSDKToolsCall is the SDK's share of a tools/call in arapd mcp's
// server, with the garbage collection of what it allocates (figures in
// docs/performance.md).
func BenchmarkSDKToolsCall(b *testing.B) {
	call := sdkToolsCall(b)
	b.ReportAllocs()
	for b.Loop() {
		call()
	}
}

// sdkToolsCall returns a function that makes one tools/call of a trivial
// tool through the SDK's stateless streamable handler, as arapd mcp runs it.
func sdkToolsCall(t testing.TB) func() {
	s := sdk.NewServer(&sdk.Implementation{Name: "t", Version: "0"}, nil)
	s.AddTool(&sdk.Tool{Name: "echo", InputSchema: map[string]any{"type": "object"}},
		func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "ok"}}}, nil
		})
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, &sdk.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	const body = `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"to":"acct-1","amount":50000}}}`
	return func() {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Accept", "application/json, text/event-stream")
		r.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		require.Equal(t, http.StatusOK, w.Code, w.Body.String())
		require.Contains(t, w.Body.String(), `"text":"ok"`)
	}
}
