package pep

import (
	"encoding/json"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/omcp/arap/mcp/tasks"
)

// What a client of MCP 2025-11-25 is told that the SDK's types cannot say:
// that this server serves that revision's tasks (mcp/tasks legacy.go).

// legacyInitialize is an initialize result at 2025-11-25: it says the
// server serves that revision's tasks (mcp/tasks legacy.go), which the
// SDK's capabilities cannot say.
type legacyInitialize struct{ *sdk.InitializeResult }

func (r legacyInitialize) MarshalJSON() ([]byte, error) {
	return withMember(r.InitializeResult, func(m map[string]any) {
		caps, _ := m["capabilities"].(map[string]any)
		if caps == nil {
			caps = map[string]any{}
		}
		caps["tasks"] = tasks.LegacyCapabilities()
		m["capabilities"] = caps
	})
}

// legacyTools is a tools/list result at 2025-11-25: every gated tool may
// be called as a task (execution.taskSupport), as an approval may need
// one; approval_status never.
type legacyTools struct{ *sdk.ListToolsResult }

func (r legacyTools) MarshalJSON() ([]byte, error) {
	return withMember(r.ListToolsResult, func(m map[string]any) {
		list, _ := m["tools"].([]any)
		for _, t := range list {
			if tool, ok := t.(map[string]any); ok && tool["name"] != ToolApprovalStatus {
				tool["execution"] = map[string]any{"taskSupport": "optional"}
			}
		}
	})
}

// withMember is v as JSON, changed by edit.
func withMember(v any, edit func(map[string]any)) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	edit(m)
	return json.Marshal(m)
}
