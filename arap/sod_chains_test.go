package arap_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dev"
)

// actChain is a subject.properties.act chain of ids, outermost first.
func actChain(ids ...string) map[string]any {
	var act map[string]any
	for i := len(ids) - 1; i >= 0; i-- {
		link := map[string]any{"sub": ids[i]}
		if act != nil {
			link["act"] = act
		}
		act = link
	}
	return act
}

// TestDecisionAPISeparationOfDutiesThroughChains: the ITSM client named
// deep in a submitted request's chains (a later link of
// subject.properties.act, the last link of a chain at the depth limit, a
// later link of client.actor's chain) cannot decide it through the decision
// API: 403 ineligible_approver, you_may_decide false, nothing recorded.
func TestDecisionAPISeparationOfDutiesThroughChains(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{})
	ctx := context.Background()
	itsm := api{t: t, base: env.URL, token: dev.ITSMToken}
	deep := make([]string, authzen.MaxActorDepth)
	for i := range deep {
		deep[i] = fmt.Sprintf("agent:a%d", i)
	}
	deep[len(deep)-1] = "agent:dev-itsm"
	for name, tc := range map[string]struct{ act, client map[string]any }{
		"second link of the subject's chain":  {act: actChain("agent:demo", "agent:DEV-ITSM")},
		"last link of a chain at the limit":   {act: actChain(deep...)},
		"second link of client.actor's chain": {act: actChain("agent:demo"), client: map[string]any{"id": "agent:demo", "act": map[string]any{"sub": "agent:dev-itsm"}}},
	} {
		t.Run(name, func(t *testing.T) {
			call := wireCall(50000)
			call["subject"].(map[string]any)["properties"] = map[string]any{"act": tc.act}
			if tc.client != nil {
				call["client"] = map[string]any{"actor": tc.client}
			}
			id := env.Submit(t, call)
			var events int
			require.NoError(t, env.Pool.QueryRow(ctx, `SELECT count(*) FROM arap.audit_events WHERE chain = $1`, id).Scan(&events))

			view := itsm.do("GET", "/v1/requests/"+id, nil).json(t)
			require.Equal(t, false, view["you_may_decide"])
			require.Contains(t, view["why_not"], "on their behalf or through them")
			r := itsm.do("POST", "/v1/requests/"+id+"/decisions", map[string]any{"decision": "approve"})
			p := r.problem(t, 403, authzen.ProblemIneligibleApprover)
			require.Contains(t, p["detail"], "on their behalf or through them")

			view = itsm.do("GET", "/v1/requests/"+id, nil).json(t)
			require.Equal(t, "pending", view["status"])
			require.Empty(t, view["votes"])
			var votes, after int
			require.NoError(t, env.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM arap.votes WHERE request_id = $1),
				(SELECT count(*) FROM arap.audit_events WHERE chain = $1)`, id).Scan(&votes, &after))
			require.Zero(t, votes)
			require.Equal(t, events, after, "a refused vote writes nothing")
		})
	}
}
