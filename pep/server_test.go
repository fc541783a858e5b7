package pep_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/pep"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// server builds the real MCP server on a fresh database; anon is the
// fixture-mode anonymous principal (nil: production). The backend is never
// reached by these requests.
func server(t *testing.T, anon *pep.Principal) string {
	t.Helper()
	return serverWith(t, pep.ServerOptions{Name: "test", Version: "0", Anonymous: anon})
}

// serverWith is server with any options.
func serverWith(t *testing.T, o pep.ServerOptions) string {
	t.Helper()
	db := dbtest.New(t)
	g, err := pep.NewGate(pep.Config{DB: db, Backend: &arapclient.Client{BaseURL: "http://127.0.0.1:1", Token: "unused"},
		MasterKey: make([]byte, 32), Tools: pep.DemoTools()})
	require.NoError(t, err)
	require.NoError(t, g.Callers().Create(context.Background(), "alice-agent", "alice-token-0123", pep.Principal{SubjectType: "user", SubjectID: "alice", ActorID: "agent:demo"}))
	srv, err := pep.NewServer(g, o)
	require.NoError(t, err)
	h := httptest.NewServer(srv)
	t.Cleanup(h.Close)
	return h.URL + pep.PathMCP
}

// post sends tools/list with the given Authorization header ("" for none).
func post(t *testing.T, url, authorization string) (int, string) {
	return send(t, url, authorization, "tools/list", `{}`)
}

// send sends one JSON-RPC request; params gets the protocol _meta.
func send(t *testing.T, url, authorization, method, params string) (int, string) {
	t.Helper()
	var p map[string]any
	require.NoError(t, json.Unmarshal([]byte(params), &p))
	p["_meta"] = map[string]any{"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": map[string]any{}}
	raw, err := json.Marshal(p)
	require.NoError(t, err)
	return sendRaw(t, url, authorization, method, string(raw))
}

// sendRaw sends one JSON-RPC request with params as given (which carry
// their own _meta).
func sendRaw(t *testing.T, url, authorization, method, params string) (int, string) {
	t.Helper()
	var p map[string]any
	require.NoError(t, json.Unmarshal([]byte(params), &p))
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": json.RawMessage(params)})
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", method)
	if name, ok := p["name"].(string); ok {
		req.Header.Set("Mcp-Name", name)
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

// TestAuthenticationProductionAndFixtureMode: without an anonymous principal
// (production, no --conformance-fixtures) a request without a token is 401;
// with one, only a request with no Authorization header at all gets in, and a
// wrong token is still 401.
func TestAuthenticationProductionAndFixtureMode(t *testing.T) {
	t.Parallel()
	t.Run("production", func(t *testing.T) {
		t.Parallel()
		url := server(t, nil)
		status, _ := post(t, url, "")
		require.Equal(t, http.StatusUnauthorized, status, "no token")
		status, _ = post(t, url, "Bearer wrong-token-0123")
		require.Equal(t, http.StatusUnauthorized, status, "wrong token")
		status, body := post(t, url, "Bearer alice-token-0123")
		require.Equal(t, http.StatusOK, status, body)
		require.Contains(t, body, "wire_transfer")
	})
	t.Run("fixture mode", func(t *testing.T) {
		t.Parallel()
		url := server(t, &pep.Principal{Name: "conformance", SubjectType: "user", SubjectID: "anonymous"})
		status, body := post(t, url, "")
		require.Equal(t, http.StatusOK, status, body)
		status, _ = post(t, url, "Bearer wrong-token-0123")
		require.Equal(t, http.StatusUnauthorized, status, "a wrong token is still refused")
		status, _ = post(t, url, "Basic YWxpY2U6eA==")
		require.Equal(t, http.StatusUnauthorized, status, "so is another scheme")
		// The anonymous caller is for the fixtures: the real tools refuse it
		// before any evaluation (a PDP that allows small transfers would
		// otherwise let anyone who can reach the port make them).
		for _, tool := range []string{"get_balance", "wire_transfer"} {
			_, body = send(t, url, "", "tools/call", `{"name":"`+tool+`","arguments":{"to":"x","amount":10}}`)
			require.Contains(t, body, "unauthenticated", "%s: %s", tool, body)
		}
	})
	t.Run("fixture mode, with a token", func(t *testing.T) {
		t.Parallel()
		url := server(t, &pep.Principal{Name: "conformance", SubjectType: "user", SubjectID: "anonymous"})
		// A caller with a token reaches the gate (whose backend here is
		// unreachable, so the evaluation fails: it was attempted).
		_, body := send(t, url, "Bearer alice-token-0123", "tools/call", `{"name":"get_balance","arguments":{}}`)
		require.NotContains(t, body, "unauthenticated")
		require.Contains(t, body, "authorization service is unavailable", body)
	})
}

// TestUnservedMethodsAreUnknown: the server advertises no prompts,
// resources or completions, so their methods are -32601 with HTTP 404
// rather than empty answers.
func TestUnservedMethodsAreUnknown(t *testing.T) {
	t.Parallel()
	url := server(t, nil)
	for _, method := range []string{"prompts/list", "resources/list", "resources/templates/list", "completion/complete"} {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"jsonrpc":"2.0","id":7,"method":"`+method+`","params":{"_meta":{
			"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
		req.Header.Set("Mcp-Method", method)
		req.Header.Set("Authorization", "Bearer alice-token-0123")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusNotFound, resp.StatusCode, "%s: %s", method, body)
		require.Contains(t, string(body), `"code":-32601`, method)
		require.Contains(t, string(body), `"id":7`, method)
	}
}

// TestProgressTokenGetsAStream: a request asking for progress is answered
// on an event stream (where progress notifications can travel); others get
// a single JSON response.
func TestProgressTokenGetsAStream(t *testing.T) {
	t.Parallel()
	url := server(t, nil)
	for token, want := range map[string]string{``: "application/json", `,"progressToken":"p-1"`: "text/event-stream"} {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"_meta":{
			"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}`+token+`}}}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
		req.Header.Set("Mcp-Method", "tools/list")
		req.Header.Set("Authorization", "Bearer alice-token-0123")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		require.Contains(t, resp.Header.Get("Content-Type"), want, "progress token %q", token)
		require.Contains(t, string(body), "wire_transfer")
	}
}
