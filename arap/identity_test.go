package arap_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dev"
)

// TestDecisionAPISeparationOfDutiesByIdentity: the ITSM client cannot decide
// a request made for it or through it, however the request spells it (case,
// type prefix, its client id; and in a stored request, whitespace, invisible
// and compatibility characters), and a refused vote records nothing.
func TestDecisionAPISeparationOfDutiesByIdentity(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{})
	ctx := context.Background()
	itsm := api{t: t, base: env.URL, token: dev.ITSMToken}
	var itsmID string
	require.NoError(t, env.Pool.QueryRow(ctx, `SELECT id FROM arap.api_clients WHERE name = 'dev-itsm'`).Scan(&itsmID))

	submitted := func(subject string) string {
		call := wireCall(50000)
		call["subject"].(map[string]any)["id"] = subject
		return env.Submit(t, call)
	}
	count := func(q, id string) int {
		var n int
		require.NoError(t, env.Pool.QueryRow(ctx, q, id).Scan(&n))
		return n
	}
	check := func(t *testing.T, id string) {
		events := count(`SELECT count(*) FROM arap.audit_events WHERE chain = $1`, id)
		r := itsm.do("POST", "/v1/requests/"+id+"/decisions", map[string]any{"decision": "approve"})
		p := r.problem(t, 403, authzen.ProblemIneligibleApprover)
		require.Contains(t, p["detail"], "on their behalf or through them")
		view := itsm.do("GET", "/v1/requests/"+id, nil).json(t)
		require.Equal(t, false, view["you_may_decide"])
		require.Equal(t, "pending", view["status"])
		require.Empty(t, view["votes"])
		require.Zero(t, count(`SELECT count(*) FROM arap.votes WHERE request_id = $1`, id))
		require.Equal(t, events, count(`SELECT count(*) FROM arap.audit_events WHERE chain = $1`, id), "a refused vote writes nothing")
	}
	for _, s := range []string{"dev-itsm", "DEV-ITSM", "Dev-Itsm", "client:dev-itsm", "CLIENT:Dev-ITSM", itsmID, strings.ToLower(itsmID)} {
		t.Run("subject "+s, func(t *testing.T) { check(t, submitted(s)) })
	}
	// Spellings evaluation and submission now refuse, in a stored request.
	for _, s := range []string{" dev-itsm", "dev-itsm ", "dev\u200b-itsm", "\u202edev-itsm", "ｄｅｖ-itsm", "dev-\u00a0itsm", "ＤＥＶ-ＩＴＳＭ"} {
		t.Run("stored subject "+s, func(t *testing.T) {
			id := submitted("alice")
			_, err := env.Pool.Exec(ctx, `UPDATE arap.requests SET subject = jsonb_set(subject, '{id}', to_jsonb($2::text)) WHERE id = $1`, id, s)
			require.NoError(t, err)
			check(t, id)
		})
	}
}

// TestNonCanonicalIdentityOverHTTP: evaluation (plain AuthZEN error) and
// submission (problem+json) refuse a subject or actor id that is not
// canonical, saying which and why; nothing is created.
func TestNonCanonicalIdentityOverHTTP(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{})
	pep := api{t: t, base: env.URL, token: dev.PEPToken}
	good := wireCall(50000)
	denial := pep.do("POST", "/access/v1/evaluation", good).json(t)
	for _, tc := range []struct{ where, id, want string }{
		{"subject", "b\u200bob", "subject.id: the identifier contains U+200B ZERO WIDTH SPACE"},
		{"subject", "ｂｏｂ", "subject.id: the identifier is not in Unicode NFKC form"},
		{"subject", "bob ", "subject.id: the identifier has whitespace"},
		{"actor", "agent:demo\u202e", "subject.properties.act.sub: the actor identifier contains U+202E"},
	} {
		call := wireCall(50000)
		if tc.where == "subject" {
			call["subject"].(map[string]any)["id"] = tc.id
		} else {
			call["subject"].(map[string]any)["properties"] = map[string]any{"act": map[string]any{"sub": tc.id}}
		}
		r := pep.do("POST", "/access/v1/evaluation", call)
		require.Equal(t, 400, r.status, "%s", r.body)
		require.Contains(t, string(r.body), tc.want)

		body := submission(t, good, denial)
		body["subject"] = call["subject"]
		p := pep.do("POST", "/access/v1/requests", body).problem(t, 400, authzen.ProblemInvalidRequest)
		require.Contains(t, p["detail"], tc.want)
	}
	var n int
	require.NoError(t, env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM arap.requests`).Scan(&n))
	require.Zero(t, n)
}
