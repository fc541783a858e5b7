package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMCPToolsLeavesOutInvalidTools: mcp tools warns of a tool whose
// x-mcp-header annotation is invalid and leaves it out (--json prints the
// others as the server sent them), and mcp call refuses it without sending
// the call.
func TestMCPToolsLeavesOutInvalidTools(t *testing.T) {
	valid := `{"name":"deploy","icons":[{"src":"https://example.com/i.png"}],"inputSchema":{"type":"object","$defs":{"x":{"type":"string"}},"properties":{"region":{"type":"string","x-mcp-header":"Region"}}}}`
	invalid := `{"name":"broken","inputSchema":{"type":"object","properties":{"v":{"type":"string","x-mcp-header":"My Region"}}}}`
	var mu sync.Mutex
	var called []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			ID     int64  `json:"id"`
			Method string `json:"method"`
			Params struct {
				Name string `json:"name"`
			} `json:"params"`
		}
		require.NoError(t, json.NewDecoder(r.Body).Decode(&req))
		result := `{"content":[]}`
		if req.Method == "tools/list" {
			result = `{"tools":[` + valid + `,` + invalid + `]}`
		} else {
			mu.Lock()
			called = append(called, req.Params.Name)
			mu.Unlock()
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"jsonrpc":"2.0","id":` + jsonInt(req.ID) + `,"result":` + result + `}`))
	}))
	defer srv.Close()
	t.Setenv("ARAP_MCP_TOKEN", "t")
	common := []string{"--url", srv.URL}

	out, notes, err := ctlNotes(t, append([]string{"mcp", "tools", "--json"}, common...)...)
	require.NoError(t, err)
	require.JSONEq(t, `[`+valid+`]`, out, "the valid tool, verbatim, members arapctl does not know included")
	require.Contains(t, notes, "warning: tool broken left out")
	require.Contains(t, notes, "My Region")

	_, err = ctl(t, append([]string{"mcp", "call", "broken", "--state", t.TempDir() + "/state", "--args", `{"v":"x"}`}, common...)...)
	require.ErrorContains(t, err, "invalid tool definition")
	_, err = ctl(t, append([]string{"mcp", "call", "deploy", "--state", t.TempDir() + "/state", "--args", `{"region":"eu"}`}, common...)...)
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"deploy"}, called, "the invalid tool was never called")
}

func jsonInt(i int64) string {
	b, _ := json.Marshal(i)
	return string(b)
}
