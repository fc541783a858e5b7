package tasks_test

import (
	"context"
	"encoding/base64"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/mcp/tasks"
)

// prop is a property schema, annotated with header unless it is "".
func prop(typ, header string) map[string]any {
	p := map[string]any{"type": typ}
	if header != "" {
		p[tasks.HeaderAnnotation] = header
	}
	return p
}

func tool(name string, props map[string]any) map[string]any {
	return map[string]any{"name": name, "inputSchema": map[string]any{"type": "object", "properties": props}}
}

// invalidTools are tool definitions whose x-mcp-header annotations break a
// rule of the 2026-07-28 streamable HTTP transport.
var invalidTools = []map[string]any{
	tool("empty", map[string]any{"v": map[string]any{"type": "string", tasks.HeaderAnnotation: ""}}),
	tool("object", map[string]any{"v": prop("object", "Data")}),
	tool("array", map[string]any{"v": prop("array", "Items")}),
	tool("null", map[string]any{"v": prop("null", "Nil")}),
	tool("number", map[string]any{"v": prop("number", "Score")}),
	tool("untyped", map[string]any{"v": map[string]any{tasks.HeaderAnnotation: "V"}}),
	tool("not_a_string", map[string]any{"v": map[string]any{"type": "string", tasks.HeaderAnnotation: 7}}),
	tool("dup_same_case", map[string]any{"a": prop("string", "Region"), "b": prop("string", "Region")}),
	tool("dup_diff_case", map[string]any{"a": prop("string", "MyField"), "b": prop("string", "myfield")}),
	tool("space", map[string]any{"v": prop("string", "My Region")}),
	tool("colon", map[string]any{"v": prop("string", "Region:Primary")}),
	tool("non_ascii", map[string]any{"v": prop("string", "Région")}),
	tool("control", map[string]any{"v": prop("string", "Region\t1")}),
	tool("under_items", map[string]any{"v": map[string]any{"type": "array", "items": map[string]any{"type": "object",
		"properties": map[string]any{"x": prop("string", "X")}}}}),
	tool("under_anyof", map[string]any{"v": map[string]any{"anyOf": []any{prop("string", "V")}}}),
	{"name": "at_root", "inputSchema": map[string]any{"type": "object", tasks.HeaderAnnotation: "Root"}},
}

// TestClientMirrorsParamHeaders lists tools (two pages), then calls the
// annotated one: each annotated argument present is mirrored into its
// Mcp-Param header, converted and encoded as the transport says (nested
// properties reached through properties alone included); absent and null
// ones are omitted, unannotated ones never mirrored.
func TestClientMirrorsParamHeaders(t *testing.T) {
	t.Parallel()
	annotated := tool("deploy", map[string]any{
		"region":   prop("string", "Region"),
		"priority": prop("integer", "Priority"),
		"verbose":  prop("boolean", "Verbose"),
		"debug":    prop("boolean", "Debug"),
		"empty":    prop("string", "EmptyVal"),
		"method":   prop("string", "Method"),
		"greeting": prop("string", "Greeting"),
		"padded":   prop("string", "Padded"),
		"lines":    prop("string", "Lines"),
		"tab":      prop("string", "Tab"),
		"sentinel": prop("string", "Sentinel"),
		"inner":    map[string]any{"type": "object", "properties": map[string]any{"zone": prop("string", "Zone")}},
		"missing":  prop("string", "Missing"),
		"nothing":  prop("string", "Nothing"),
		"query":    prop("string", ""), // not annotated
		"float":    prop("number", ""),
	})
	srv, got := scripted(t, func(n int, r seen) map[string]any {
		switch {
		case r.Method == "tools/list" && r.Params["cursor"] == nil:
			return map[string]any{"result": map[string]any{"tools": []any{tool("other", nil)}, "nextCursor": "p2"}}
		case r.Method == "tools/list":
			return map[string]any{"result": map[string]any{"tools": []any{annotated}}}
		}
		return map[string]any{"result": map[string]any{"content": []any{}}}
	})
	c := &tasks.Client{URL: srv.URL, Token: "t"}
	args := map[string]any{
		"region": "us-west1", "priority": float64(42), "verbose": false, "debug": true, "empty": "", "method": "m",
		"greeting": "Hello, 世界", "padded": " padded ", "lines": "line1\nline2", "tab": "\tx", "sentinel": "=?base64?literal?=",
		"inner": map[string]any{"zone": "b"}, "nothing": nil, "query": "SELECT 1", "float": 3.14,
	}
	_, err := c.CallTool(context.Background(), "deploy", args, nil)
	require.NoError(t, err)
	reqs := got()
	require.Len(t, reqs, 3, "two pages of tools/list, then the call")
	h := reqs[2].Header
	b64 := func(s string) string { return "=?base64?" + base64.StdEncoding.EncodeToString([]byte(s)) + "?=" }
	want := map[string]string{
		"Region": "us-west1", "Priority": "42", "Verbose": "false", "Debug": "true", "EmptyVal": "", "Method": "m",
		"Greeting": b64("Hello, 世界"), "Padded": b64(" padded "), "Lines": b64("line1\nline2"), "Tab": b64("\tx"),
		"Sentinel": b64("=?base64?literal?="), "Zone": "b",
	}
	for name, v := range want {
		vals, ok := h[http.CanonicalHeaderKey(tasks.HeaderParamPrefix+name)]
		require.True(t, ok, "no %s%s header", tasks.HeaderParamPrefix, name)
		require.Equal(t, []string{v}, vals, name)
	}
	for _, name := range []string{"Missing", "Nothing", "Query", "Float"} {
		require.Empty(t, h.Values(tasks.HeaderParamPrefix+name), name)
	}
	require.Equal(t, "m", h.Get("Mcp-Param-Method"))
	require.Equal(t, "tools/call", h.Get(tasks.HeaderMethod), "Mcp-Param-Method must not replace Mcp-Method")
}

// TestClientRejectsInvalidToolDefinitions: every tool with an invalid
// x-mcp-header annotation is left out of ListTools with its reason, and
// CallTool refuses it with ErrInvalidTool without sending anything, while
// the valid tool beside them stays callable.
func TestClientRejectsInvalidToolDefinitions(t *testing.T) {
	t.Parallel()
	list := []any{tool("valid", map[string]any{"region": prop("string", "Region")})}
	for _, d := range invalidTools {
		list = append(list, d)
	}
	srv, got := scripted(t, func(n int, r seen) map[string]any {
		if r.Method == "tools/list" {
			return map[string]any{"result": map[string]any{"tools": list}}
		}
		return map[string]any{"result": map[string]any{"content": []any{}}}
	})
	c := &tasks.Client{URL: srv.URL, Token: "t"}
	tools, rejected, err := c.ListTools(context.Background())
	require.NoError(t, err)
	require.Len(t, tools, 1)
	require.Equal(t, "valid", tools[0].Name)
	require.Len(t, rejected, len(invalidTools))
	for i, r := range rejected {
		require.Equal(t, invalidTools[i]["name"], r.Name)
		require.Error(t, r.Reason)
	}
	for _, d := range invalidTools {
		_, err := c.CallTool(context.Background(), d["name"].(string), map[string]any{"v": "x"}, nil)
		require.ErrorIs(t, err, tasks.ErrInvalidTool, d["name"])
	}
	_, err = c.CallTool(context.Background(), "valid", map[string]any{"region": "eu"}, nil)
	require.NoError(t, err)
	reqs := got()
	require.Len(t, reqs, 2, "tools/list and the valid call; no invalid tool was called")
	require.Equal(t, "valid", reqs[1].Params["name"])
	require.Equal(t, "eu", reqs[1].Header.Get("Mcp-Param-Region"))
}

// TestClientListToolsPagesBounded: a server that hands out cursors forever
// is not followed past the bound.
func TestClientListToolsPagesBounded(t *testing.T) {
	t.Parallel()
	srv, got := scripted(t, func(n int, r seen) map[string]any {
		return map[string]any{"result": map[string]any{"tools": []any{}, "nextCursor": "again"}}
	})
	c := &tasks.Client{URL: srv.URL, Token: "t"}
	_, _, err := c.ListTools(context.Background())
	require.ErrorContains(t, err, "pages")
	require.Len(t, got(), 20)
}

// TestClientEncodesMcpName: a tool name that is not plain visible ASCII
// travels in Mcp-Name Base64-encoded.
func TestClientEncodesMcpName(t *testing.T) {
	t.Parallel()
	srv, got := scripted(t, func(n int, r seen) map[string]any {
		return map[string]any{"result": map[string]any{"tools": []any{}, "content": []any{}}}
	})
	c := &tasks.Client{URL: srv.URL, Token: "t"}
	_, err := c.CallTool(context.Background(), "überweisen", map[string]any{}, nil)
	require.NoError(t, err)
	reqs := got()
	require.Equal(t, "=?base64?"+base64.StdEncoding.EncodeToString([]byte("überweisen"))+"?=", reqs[len(reqs)-1].Header.Get(tasks.HeaderName))
}
