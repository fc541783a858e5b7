package arap_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/signing"
)

// searchPolicy allows seven tools, makes one requestable, denies one, and
// allows one for bob only; tools/read is allowed on t01.
const searchPolicy = `version: 1
rules:
  - {name: bob_only, match: {action: tools/call, resource_type: mcp_tool, resource_id: bob_only}, when: 'subject.id == "bob"', effect: allow}
  - {name: denied, match: {action: tools/call, resource_type: mcp_tool, resource_id: d_denied}, effect: deny, reason: no}
  - name: needs_approval
    match: {action: tools/call, resource_type: mcp_tool, resource_id: r_needs_approval}
    effect: request
    approval: {kinds: [itsm]}
  - {name: t01, match: {action: tools/call, resource_type: mcp_tool, resource_id: t01}, effect: allow}
  - {name: t01_read, match: {action: tools/read, resource_type: mcp_tool, resource_id: t01}, effect: allow}
  - {name: t02, match: {action: tools/call, resource_type: mcp_tool, resource_id: t02}, effect: allow}
  - {name: t03, match: {action: tools/call, resource_type: mcp_tool, resource_id: t03}, effect: allow}
  - {name: t04, match: {action: tools/call, resource_type: mcp_tool, resource_id: t04}, effect: allow}
  - {name: t05, match: {action: tools/call, resource_type: mcp_tool, resource_id: t05}, effect: allow}
  - {name: t06, match: {action: tools/call, resource_type: mcp_tool, resource_id: t06}, effect: allow}
  - {name: t07, match: {action: tools/call, resource_type: mcp_tool, resource_id: t07}, effect: allow}
  - {name: other_type, match: {action: tools/call, resource_type: document, resource_id: doc1}, effect: allow}
`

var alice = authzen.Object{"type": "user", "id": "alice"}

func searchSetup(t *testing.T) (*backendtest.Env, *arapclient.Client) {
	t.Helper()
	env := backendtest.Start(t, backendtest.Options{Policy: []byte(searchPolicy)})
	return env, &arapclient.Client{BaseURL: env.URL, Token: dev.PEPToken}
}

func ids(rs []authzen.Object, member string) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Str(member))
	}
	return out
}

// TestResourceSearchPagesThroughAllowedOnly: a resource search returns the
// tools alice may call now, in pages of at most the limit, across which
// every allowed tool appears once; the requestable tool (decision false,
// an approval first), the denied one and bob's are never results.
func TestResourceSearchPagesThroughAllowedOnly(t *testing.T) {
	t.Parallel()
	_, c := searchSetup(t)
	ctx := context.Background()

	// The requestable tool is requestable by the evaluation itself.
	call := authzen.EvaluationRequest{Subject: alice, Action: authzen.Object{"name": "tools/call"}, Resource: authzen.Object{"type": "mcp_tool", "id": "r_needs_approval"}}
	d, err := c.Evaluate(ctx, call)
	require.NoError(t, err)
	_, requestable := arapclient.Requestable(call, d)
	require.True(t, requestable)

	req := authzen.SearchRequest{Subject: alice, Action: authzen.Object{"name": "tools/call"}, Resource: authzen.Object{"type": "mcp_tool"},
		Page: &authzen.PageParams{Limit: 3}}
	var got []string
	pages := 0
	for {
		resp, err := c.Search(ctx, authzen.SearchResource, req)
		require.NoError(t, err)
		pages++
		require.LessOrEqual(t, len(resp.Results), 3)
		require.Equal(t, len(resp.Results), resp.Page.Count)
		for _, r := range resp.Results {
			require.Equal(t, "mcp_tool", r.Str("type"))
		}
		got = append(got, ids(resp.Results, "id")...)
		if resp.Page.NextToken == "" {
			break
		}
		require.Less(t, pages, 10)
		req.Page.Token = resp.Page.NextToken
	}
	require.Equal(t, []string{"t01", "t02", "t03", "t04", "t05", "t06", "t07"}, got)
	require.GreaterOrEqual(t, pages, 3)

	// The iterator walks the same pages; bob also gets his own tool.
	var all []string
	for r, err := range c.SearchAll(ctx, authzen.SearchResource, authzen.SearchRequest{Subject: authzen.Object{"type": "user", "id": "bob"},
		Action: authzen.Object{"name": "tools/call"}, Resource: authzen.Object{"type": "mcp_tool"}, Page: &authzen.PageParams{Limit: 2}}) {
		require.NoError(t, err)
		all = append(all, r.Str("id"))
	}
	require.Equal(t, []string{"bob_only", "t01", "t02", "t03", "t04", "t05", "t06", "t07"}, all)
}

// TestSubjectAndActionSearch: subjects are the directory's users the call
// is allowed for; actions are those the rules name that are allowed; a
// requestable resource allows no action.
func TestSubjectAndActionSearch(t *testing.T) {
	t.Parallel()
	_, c := searchSetup(t)
	ctx := context.Background()
	collect := func(kind string, req authzen.SearchRequest, member string) []string {
		var out []string
		for r, err := range c.SearchAll(ctx, kind, req) {
			require.NoError(t, err)
			out = append(out, r.Str(member))
		}
		return out
	}
	tool := func(id string) authzen.Object { return authzen.Object{"type": "mcp_tool", "id": id} }
	call := authzen.Object{"name": "tools/call"}

	require.Equal(t, []string{"bob"}, collect(authzen.SearchSubject, authzen.SearchRequest{Subject: authzen.Object{"type": "user"}, Action: call, Resource: tool("bob_only")}, "id"))
	everyone := collect(authzen.SearchSubject, authzen.SearchRequest{Subject: authzen.Object{"type": "user"}, Action: call, Resource: tool("t01"), Page: &authzen.PageParams{Limit: 2}}, "id")
	require.Subset(t, everyone, []string{"alice", "bob", "carol", "dave", "erin"})
	require.True(t, slices.IsSorted(everyone))
	require.Empty(t, collect(authzen.SearchSubject, authzen.SearchRequest{Subject: authzen.Object{"type": "user"}, Action: call, Resource: tool("r_needs_approval")}, "id"))
	require.Empty(t, collect(authzen.SearchSubject, authzen.SearchRequest{Subject: authzen.Object{"type": "service"}, Action: call, Resource: tool("t01")}, "id"),
		"the directory holds users only")

	require.Equal(t, []string{"tools/call", "tools/read"}, collect(authzen.SearchAction, authzen.SearchRequest{Subject: alice, Resource: tool("t01")}, "name"))
	require.Equal(t, []string{"tools/call"}, collect(authzen.SearchAction, authzen.SearchRequest{Subject: alice, Resource: tool("t02")}, "name"))
	require.Empty(t, collect(authzen.SearchAction, authzen.SearchRequest{Subject: alice, Resource: tool("r_needs_approval")}, "name"))

	require.Equal(t, []string{"doc1"}, collect(authzen.SearchResource, authzen.SearchRequest{Subject: alice, Action: call, Resource: authzen.Object{"type": "document"}}, "id"))

	m, err := c.Metadata(ctx)
	require.NoError(t, err)
	require.Equal(t, c.BaseURL+authzen.PathSearchSubject, m.SearchSubjectEndpoint)
	require.Equal(t, c.BaseURL+authzen.PathSearchResource, m.SearchResourceEndpoint)
	require.Equal(t, c.BaseURL+authzen.PathSearchAction, m.SearchActionEndpoint)
}

// TestSearchPageTokensCannotBeForged: a page token is honoured only as
// issued, for the same search by the same client: garbage, a token with
// its position altered, one from another search or another client are
// refused with 400 and a message saying what to do.
func TestSearchPageTokensCannotBeForged(t *testing.T) {
	t.Parallel()
	env, c := searchSetup(t)
	ctx := context.Background()
	req := func() authzen.SearchRequest {
		return authzen.SearchRequest{Subject: alice, Action: authzen.Object{"name": "tools/call"}, Resource: authzen.Object{"type": "mcp_tool"}, Page: &authzen.PageParams{Limit: 2}}
	}
	first, err := c.Search(ctx, authzen.SearchResource, req())
	require.NoError(t, err)
	require.Equal(t, []string{"t01", "t02"}, ids(first.Results, "id"))
	token := first.Page.NextToken
	require.NotEmpty(t, token)

	refused := func(r authzen.SearchRequest, with string, client *arapclient.Client) {
		t.Helper()
		if client == nil {
			client = c
		}
		r.Page.Token = with
		_, err := client.Search(ctx, authzen.SearchResource, r)
		var pe *arapclient.ProblemError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, http.StatusBadRequest, pe.Status)
		require.Contains(t, pe.Problem.Detail, "page.token")
	}
	refused(req(), "garbage", nil)

	// Moving the position forward in the payload breaks the signature.
	parts := strings.Split(token, ".")
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	require.NoError(t, err)
	forged := strings.Replace(string(payload), `"off":`, `"off":1`, 1)
	require.NotEqual(t, string(payload), forged)
	refused(req(), parts[0]+"."+base64.RawURLEncoding.EncodeToString([]byte(forged))+"."+parts[2], nil)

	other := req()
	other.Action = authzen.Object{"name": "tools/read"}
	refused(other, token, nil)

	_, secret, err := env.Backend.Clients().Create(ctx, clients.New{Name: "other-pep", Scopes: []string{clients.ScopeEvaluate}, Kind: clients.KindAutomation}, "test")
	require.NoError(t, err)
	refused(req(), token, &arapclient.Client{BaseURL: env.URL, Token: secret})

	// A token this service signed, for this search and client, but past
	// its expiry.
	var claims jwt.MapClaims
	require.NoError(t, json.Unmarshal(payload, &claims))
	claims["exp"] = time.Now().Add(-time.Minute).Unix()
	expired, err := env.Backend.Keys().Sign(ctx, signing.TypePage, claims)
	require.NoError(t, err)
	refused(req(), expired, nil)

	// The token as issued goes on where the first page ended.
	r := req()
	r.Page.Token = token
	second, err := c.Search(ctx, authzen.SearchResource, r)
	require.NoError(t, err)
	require.Equal(t, []string{"t03", "t04"}, ids(second.Results, "id"))
}

// TestSearchRefusesMalformedRequests: bad limits, the searched member given
// whole, an approval, and a client without the evaluate scope.
func TestSearchRefusesMalformedRequests(t *testing.T) {
	t.Parallel()
	env, c := searchSetup(t)
	ctx := context.Background()
	bad := func(kind string, r authzen.SearchRequest, want string) {
		t.Helper()
		_, err := c.Search(ctx, kind, r)
		var pe *arapclient.ProblemError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, http.StatusBadRequest, pe.Status)
		require.Contains(t, pe.Problem.Detail, want)
	}
	call := authzen.Object{"name": "tools/call"}
	tools := authzen.Object{"type": "mcp_tool"}
	bad(authzen.SearchResource, authzen.SearchRequest{Subject: alice, Action: call, Resource: tools, Page: &authzen.PageParams{Limit: 101}}, "page.limit must be between 1 and 100")
	bad(authzen.SearchResource, authzen.SearchRequest{Subject: alice, Action: call, Resource: tools, Page: &authzen.PageParams{Limit: -1}}, "page.limit")
	bad(authzen.SearchResource, authzen.SearchRequest{Subject: alice, Action: call, Resource: authzen.Object{"type": "mcp_tool", "id": "t01"}}, "without resource.id")
	bad(authzen.SearchSubject, authzen.SearchRequest{Subject: alice, Action: call, Resource: authzen.Object{"type": "mcp_tool", "id": "t01"}}, "without subject.id")
	bad(authzen.SearchAction, authzen.SearchRequest{Subject: alice, Action: call, Resource: authzen.Object{"type": "mcp_tool", "id": "t01"}}, "leave action out")
	bad(authzen.SearchResource, authzen.SearchRequest{Subject: alice, Resource: tools}, "malformed")
	bad(authzen.SearchResource, authzen.SearchRequest{Subject: alice, Action: call, Resource: tools, Context: authzen.Object{"approval": map[string]any{"id": "x"}}}, "context.approval")

	resolver := &arapclient.Client{BaseURL: env.URL, Token: dev.ResolverToken}
	_, err := resolver.Search(ctx, authzen.SearchResource, authzen.SearchRequest{Subject: alice, Action: call, Resource: tools})
	var pe *arapclient.ProblemError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, http.StatusForbidden, pe.Status)
}
