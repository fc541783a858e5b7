package pep_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
)

// legacyCall sends one JSON-RPC request as a client of MCP 2025-11-25
// (its MCP-Protocol-Version header, no per-request _meta) and returns the
// result, or the error.
func (p *stack) legacyCall(t *testing.T, method string, params map[string]any) (map[string]any, *tasks.RPCError) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	req, err := http.NewRequest(http.MethodPost, p.url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+aliceToken)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if method != "initialize" {
		req.Header.Set("MCP-Protocol-Version", tasks.LegacyVersion)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out struct {
		Result map[string]any  `json:"result"`
		Error  *tasks.RPCError `json:"error"`
	}
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	// A forwarded request may be answered on an event stream (the
	// upstream's log messages travel with it); the answer is its last
	// data line.
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		var last string
		for _, line := range strings.Split(string(raw), "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok {
				last = d
			}
		}
		raw = []byte(last)
	}
	require.NoError(t, json.Unmarshal(raw, &out), "%s", raw)
	return out.Result, out.Error
}

// TestLegacyTasks (issue 33): a client of MCP 2025-11-25 drives the same
// approval task through that revision's tasks utility, which the TypeScript
// SDK v1's experimental tasks API speaks: the server says so at initialize
// and on each gated tool; params.task gets {task}; tasks/get the Task;
// tasks/result the CallToolResult once over, with its related task;
// tasks/list the caller's tasks, a page at a time; tasks/cancel the
// cancelled Task. tasks/update is not of that revision, and a 2026-07-28
// request cannot use tasks/result.
func TestLegacyTasks(t *testing.T) {
	t.Parallel()
	p := newPEP(t, pepOptions{})
	init, rpcErr := p.legacyCall(t, "initialize", map[string]any{"protocolVersion": tasks.LegacyVersion, "capabilities": map[string]any{"tasks": map[string]any{}},
		"clientInfo": map[string]any{"name": "legacy", "version": "1"}})
	require.Nil(t, rpcErr)
	require.Equal(t, tasks.LegacyVersion, init["protocolVersion"])
	require.Equal(t, tasks.LegacyCapabilities(), init["capabilities"].(map[string]any)["tasks"])
	list, rpcErr := p.legacyCall(t, "tools/list", map[string]any{})
	require.Nil(t, rpcErr)
	for _, tl := range list["tools"].([]any) {
		require.Equal(t, map[string]any{"taskSupport": "optional"}, tl.(map[string]any)["execution"], "%v", tl)
	}

	call := func(amount int) string {
		res, rpcErr := p.legacyCall(t, "tools/call", map[string]any{"name": "wire_transfer", "arguments": map[string]any{"to": "acct-l", "amount": amount},
			"task": map[string]any{"ttl": 60000}})
		require.Nil(t, rpcErr)
		task := res["task"].(map[string]any)
		require.Equal(t, "working", task["status"], "%v", res)
		require.NotContains(t, res, "resultType")
		return task["taskId"].(string)
	}
	id := call(50701)
	got, rpcErr := p.legacyCall(t, "tasks/get", map[string]any{"taskId": id})
	require.Nil(t, rpcErr)
	require.Equal(t, id, got["taskId"])
	require.Equal(t, "working", got["status"])
	require.Contains(t, got, "ttl")

	p.approve(t, p.request(t, id), time.Time{})
	p.advance(t, id)
	res, rpcErr := p.legacyCall(t, "tasks/result", map[string]any{"taskId": id})
	require.Nil(t, rpcErr)
	require.Equal(t, pep.ApprovedExecuted, res["_meta"].(map[string]any)[pep.MetaDisposition])
	require.Equal(t, map[string]any{"taskId": id}, res["_meta"].(map[string]any)[tasks.MetaRelatedTask])
	require.Equal(t, 1, p.ledger(t, id))

	second := call(50702)
	cancelled, rpcErr := p.legacyCall(t, "tasks/cancel", map[string]any{"taskId": second})
	require.Nil(t, rpcErr)
	require.Equal(t, "cancelled", cancelled["status"])
	_, rpcErr = p.legacyCall(t, "tasks/result", map[string]any{"taskId": second})
	require.NotNil(t, rpcErr)
	require.Contains(t, rpcErr.Message, "cancelled")

	page, rpcErr := p.legacyCall(t, "tasks/list", map[string]any{})
	require.Nil(t, rpcErr)
	var ids []string
	for _, tk := range page["tasks"].([]any) {
		ids = append(ids, tk.(map[string]any)["taskId"].(string))
	}
	require.Equal(t, []string{second, id}, ids, "newest first")
	_, rpcErr = p.legacyCall(t, "tasks/list", map[string]any{"cursor": "nonsense"})
	require.NotNil(t, rpcErr)

	_, rpcErr = p.legacyCall(t, "tasks/update", map[string]any{"taskId": id, "inputResponses": map[string]any{}})
	require.NotNil(t, rpcErr)
	require.Equal(t, -32601, rpcErr.Code)
	// Another caller's task is not found.
	require.NoError(t, p.gate.Callers().Create(context.Background(), "mallory-agent", "mallory-token-01", pep.Principal{SubjectType: "user", SubjectID: "mallory", ActorID: "agent:demo"}))
	mallory := &tasks.Client{URL: p.url, Token: "mallory-token-01"}
	r, err := mallory.Call(context.Background(), tasks.MethodResult, id, map[string]any{"taskId": id})
	require.NoError(t, err)
	require.NotNil(t, r.Error, "at 2026-07-28 tasks/result does not exist: %s", r.Raw)
	require.Equal(t, -32601, r.Error.Code)
}
