package pep

import (
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// TestToolDigestCoversDefinition: every part of a definition a client or
// the policy sees changes the digest (so an approval does not carry over
// to it); what is this server's own (TaskRequired, Run) does not.
func TestToolDigestCoversDefinition(t *testing.T) {
	yes, no := true, false
	base := func() Tool {
		return Tool{Name: "drop_table", Title: "Drop", Description: "Drop a table.", Upstream: "db", UpstreamTool: "drop",
			InputSchema: map[string]any{"type": "object"}, OutputSchema: map[string]any{"type": "object"},
			Annotations: &sdk.ToolAnnotations{DestructiveHint: &yes}}
	}
	d0, err := ToolDigest(base())
	require.NoError(t, err)
	for what, f := range map[string]func(*Tool){
		"name": func(t *Tool) { t.Name = "drop" }, "title": func(t *Tool) { t.Title = "Drop!" },
		"description": func(t *Tool) { t.Description = "Drop it." }, "upstream": func(t *Tool) { t.Upstream = "db2" },
		"upstream tool":  func(t *Tool) { t.UpstreamTool = "drop2" },
		"input schema":   func(t *Tool) { t.InputSchema = map[string]any{"type": "object", "required": []any{"x"}} },
		"output schema":  func(t *Tool) { t.OutputSchema = nil },
		"destructive":    func(t *Tool) { t.Annotations.DestructiveHint = &no },
		"read-only":      func(t *Tool) { t.Annotations.ReadOnlyHint = true },
		"idempotent":     func(t *Tool) { t.Annotations.IdempotentHint = true },
		"open world":     func(t *Tool) { t.Annotations.OpenWorldHint = &no },
		"no annotations": func(t *Tool) { t.Annotations = nil },
	} {
		tool := base()
		f(&tool)
		d, err := ToolDigest(tool)
		require.NoError(t, err)
		require.NotEqual(t, d0, d, what)
	}
	same := base()
	same.TaskRequired = true
	d, err := ToolDigest(same)
	require.NoError(t, err)
	require.Equal(t, d0, d)
}

// TestResourceProperties: the PDP sees the arguments, the upstream and its
// tool name, and the hints the tool sets; nothing of annotations a tool
// does not have.
func TestResourceProperties(t *testing.T) {
	args := map[string]any{"table": "orders"}
	require.Equal(t, map[string]any{"arguments": args}, resourceProperties(&Tool{Name: "x"}, args))
	no := false
	require.Equal(t, map[string]any{"arguments": args, "upstream": "db", "upstream_tool": "drop",
		"annotations": map[string]any{"readOnlyHint": true, "idempotentHint": false, "openWorldHint": false}},
		resourceProperties(&Tool{Name: "x", Upstream: "db", UpstreamTool: "drop", Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &no}}, args))
}
