package evaluation_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/signing"
)

const searchPolicy = `version: 1
rules:
  - {name: yes, match: {action: tools/call, resource_type: mcp_tool, resource_id: yes}, effect: allow}
  - {name: shared, match: {action: tools/read, resource_id: shared}, effect: allow}
  - {name: ask, match: {action: tools/call, resource_type: mcp_tool, resource_id: ask}, effect: request, approval: {kinds: [itsm]}}
  - {name: by_condition, match: {resource_type: mcp_tool}, when: 'resource.id == "hidden"', effect: allow}
  - {name: several, match: {actions: [tools/list, tools/read], resource_id: shared}, effect: allow}
`

// TestSearchCandidates: the candidates are what the rules' matches name; a
// rule that matches by condition alone names nothing.
func TestSearchCandidates(t *testing.T) {
	p, err := evaluation.Parse("p.yaml", []byte(searchPolicy))
	require.NoError(t, err)
	require.Equal(t, []string{"tools/call", "tools/list", "tools/read"}, p.SearchActions(), "match.action and match.actions")
	require.Equal(t, []string{"ask", "shared", "yes"}, p.SearchResources("mcp_tool"))
	require.Equal(t, []string{"shared"}, p.SearchResources("document"))
}

// TestSearchPageIsBounded: a page decides at most MaxSearchExamined
// candidates however few are allowed, says where to go on, and keeps only
// allows (the requestable candidate is not one).
func TestSearchPageIsBounded(t *testing.T) {
	p, err := evaluation.Parse("p.yaml", []byte(searchPolicy))
	require.NoError(t, err)
	keys, err := signing.Open(context.Background(), dbtest.New(t), signing.Options{MasterKey: make([]byte, 32)})
	require.NoError(t, err)
	e, err := evaluation.New(evaluation.Options{Policy: p, Keys: keys, Issuer: issuer, RequestsURL: requestsURL})
	require.NoError(t, err)

	n := 2*evaluation.MaxSearchExamined + 200
	candidates := make([]authzen.EvaluationRequest, n)
	for i := range candidates {
		id := "no"
		switch i {
		case n - 2:
			id = "ask"
		case n - 1:
			id = "yes"
		}
		candidates[i] = authzen.EvaluationRequest{Subject: authzen.Object{"type": "user", "id": "alice"},
			Action: authzen.Object{"name": "tools/call"}, Resource: authzen.Object{"type": "mcp_tool", "id": id}}
	}
	ctx := context.Background()
	allowed, next, err := e.SearchPage(ctx, "c1", candidates, 0, 10)
	require.NoError(t, err)
	require.Empty(t, allowed)
	require.Equal(t, evaluation.MaxSearchExamined, next)
	allowed, next, err = e.SearchPage(ctx, "c1", candidates, next, 10)
	require.NoError(t, err)
	require.Empty(t, allowed)
	require.Equal(t, 2*evaluation.MaxSearchExamined, next)
	allowed, next, err = e.SearchPage(ctx, "c1", candidates, next, 10)
	require.NoError(t, err)
	require.Equal(t, []int{n - 1}, allowed, "the allow, not the requestable denial before it")
	require.Equal(t, n, next)
}
