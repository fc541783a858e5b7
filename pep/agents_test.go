package pep_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/agentauth"
	"github.com/omcp/arap/internal/oidctest"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
)

const agentResource = "http://mcp.test/mcp"

// TestOAuthCallers (issue 33): arapd mcp is an OAuth protected resource as
// the MCP authorization specification describes. A request without a
// token gets 401 naming the protected resource metadata, which names the
// authorization server; an access token from that server (token exchange:
// alice through agent:demo) is a caller whose call is gated, approved and
// run like any other, the PDP seeing the act chain and the client; a token
// short of the scope gets 403 insufficient_scope; arap's own caller tokens
// keep working beside them, as a different principal.
func TestOAuthCallers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	op := oidctest.Start(t)
	for _, u := range []oidctest.User{{ID: "alice", Username: "alice", Password: "pw-a"}, {ID: "agent:demo", Username: "agent", Password: "pw-g"},
		{ID: "agent:orchestrator", Username: "orch", Password: "pw-o"}} {
		op.Put(u)
	}
	agents, err := agentauth.New(agentauth.Config{Resource: agentResource, Issuers: []string{op.Issuer}, Scopes: []string{"mcp"}})
	require.NoError(t, err)
	p := newPEP(t, pepOptions{agents: agents})

	// No token: 401 naming the metadata, which names the server.
	resp, err := http.Post(p.url, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Equal(t, `Bearer resource_metadata="http://mcp.test/.well-known/oauth-protected-resource/mcp", scope="mcp"`, resp.Header.Get("WWW-Authenticate"))
	for _, path := range []string{"/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"} {
		resp, err = http.Get(p.server + path)
		require.NoError(t, err)
		var prm map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&prm))
		resp.Body.Close()
		require.Equal(t, agentResource, prm["resource"], path)
		require.Equal(t, []any{op.Issuer}, prm["authorization_servers"])
		require.Equal(t, []any{"mcp"}, prm["scopes_supported"])
	}

	alice, agent := op.UserToken(t, "alice", "pw-a"), op.UserToken(t, "agent", "pw-g")
	jwt := op.Exchange(t, alice, agent, agentResource)
	c := &tasks.Client{URL: p.url, Token: jwt}
	r, err := c.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-oauth", "amount": 50801}, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeTask, r.ResultType, "%s", r.Raw)
	id := r.Task.TaskID
	var principal string
	require.NoError(t, p.db.QueryRow(ctx, `SELECT principal FROM pep.approval_tasks WHERE task_id = $1`, id).Scan(&principal))
	require.Equal(t, "oauth|"+op.Issuer+"|user:alice|agent:demo", principal)
	code, req := p.backendAPI(t, "dev-itsm-token", "GET", "/v1/requests/"+p.request(t, id), nil)
	require.Equal(t, 200, code, "%v", req)
	subject := req["subject"].(map[string]any)
	require.Equal(t, "alice", subject["id"])
	props := subject["properties"].(map[string]any)
	require.Equal(t, map[string]any{"sub": "agent:demo"}, props["act"])
	require.Equal(t, oidctest.AgentClientID, props["client_id"])
	p.approve(t, p.request(t, id), time.Time{})
	p.advance(t, id)
	require.Equal(t, pep.ApprovedExecuted, disposition(t, p.task(t, id)), "an OAuth caller's approved call runs")
	_, _, err = p.alice.Get(ctx, id)
	require.Error(t, err, "arap's alice is another principal: the task is not hers")

	// A longer chain: the agent acting for an orchestrator, for alice.
	chained := op.Exchange(t, alice, op.Exchange(t, agent, op.UserToken(t, "orch", "pw-o"), oidctest.AgentClientID), agentResource)
	r, err = (&tasks.Client{URL: p.url, Token: chained}).CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-oauth", "amount": 50802}, nil)
	require.NoError(t, err)
	code, req = p.backendAPI(t, "dev-itsm-token", "GET", "/v1/requests/"+p.request(t, r.Task.TaskID), nil)
	require.Equal(t, 200, code)
	require.Equal(t, map[string]any{"sub": "agent:demo", "act": map[string]any{"sub": "agent:orchestrator"}},
		req["subject"].(map[string]any)["properties"].(map[string]any)["act"])

	// Refusals: another audience (401), no such scope (403).
	for _, c := range []struct {
		token string
		code  int
		err   string
	}{
		{alice, http.StatusUnauthorized, `error="invalid_token"`},
		{"not-a-caller-nor-a-jwt", http.StatusUnauthorized, `error="invalid_token"`},
	} {
		req, _ := http.NewRequest(http.MethodPost, p.url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		req.Header.Set("Authorization", "Bearer "+c.token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, c.code, resp.StatusCode)
		require.Contains(t, resp.Header.Get("WWW-Authenticate"), c.err)
		require.Contains(t, resp.Header.Get("WWW-Authenticate"), "resource_metadata=")
	}
	scoped, err := agentauth.New(agentauth.Config{Resource: agentResource, Issuers: []string{op.Issuer}, Scopes: []string{"payments"}})
	require.NoError(t, err)
	q := newPEP(t, pepOptions{agents: scoped})
	req2, _ := http.NewRequest(http.MethodPost, q.url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	req2.Header.Set("Authorization", "Bearer "+jwt)
	req2.Header.Set("Content-Type", "application/json")
	resp, err = http.DefaultClient.Do(req2)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Contains(t, resp.Header.Get("WWW-Authenticate"), `error="insufficient_scope"`)
	require.Contains(t, resp.Header.Get("WWW-Authenticate"), `scope="payments"`)

	// arap's caller tokens work beside OAuth.
	_, _, err = p.alice.ListTools(ctx)
	require.NoError(t, err)
}
