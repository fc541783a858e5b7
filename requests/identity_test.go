package requests_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/requests"
)

// chain builds a subject.properties.act chain of the given actor ids,
// outermost first.
func chain(ids ...string) map[string]any {
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

func withActors(req authzen.EvaluationRequest, act map[string]any) authzen.EvaluationRequest {
	props := map[string]any{}
	if act != nil {
		props["act"] = act
	}
	req.Subject = authzen.Object{"type": "user", "id": req.Subject.Str("id"), "properties": props}
	return req
}

// TestBobWrittenDifferentlyIsBob: separation of duties compares identities,
// not strings. Every spelling of bob as the subject or as an actor leaves
// bob ineligible, even in a request stored before non-canonical identifiers
// were refused, and nothing is recorded.
func TestBobWrittenDifferentlyIsBob(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	ctx := context.Background()
	r := f.submitFor("alice", "wire_transfer", map[string]any{"to": "acct-991", "amount": 50000})
	spellings := []string{"bob", "BOB", "Bob", "user:bob", "USER:Bob", "bob@example.com", "BOB@EXAMPLE.COM", "mailto:bob@example.com",
		" bob", "bob ", "b ob", "b\u200bob", "bob\u200d", "\u202ebob", "bo\u00adb", "ｂｏｂ", "\u1d2e\u1d3c\u1d2e", "b\u00a0ob"}
	for _, s := range spellings {
		for _, where := range []string{"subject", "actor", "client actor"} {
			t.Run(fmt.Sprintf("%s %q", where, s), func(t *testing.T) {
				stored := *r
				stored.Subject = authzen.Object{"type": "user", "id": "alice", "properties": map[string]any{"act": chain("agent:demo")}}
				stored.ClientInfo = nil
				switch where {
				case "subject":
					stored.Subject["id"] = s
				case "actor":
					stored.Subject["properties"] = map[string]any{"act": chain("agent:demo", s)}
				case "client actor":
					stored.ClientInfo = &authzen.ClientInfo{Actor: authzen.Object{"id": "agent:demo", "act": map[string]any{"sub": s}}}
				}
				err := requests.Eligible(bob, &stored, time.Now())
				require.Equal(t, authzen.ProblemIneligibleApprover, requests.ErrorCode(err), "%v", err)
				require.Contains(t, err.Error(), "on their behalf or through them")
				ok, why := requests.MayDecide(bob, &stored, nil, time.Now())
				require.False(t, ok)
				require.Contains(t, why, "on their behalf")
			})
		}
	}
	// Carol is still carol.
	require.NoError(t, requests.Eligible(carol, r, time.Now()))
	// And the same through the service, for a stored request: nothing recorded.
	_, err := f.db.Exec(ctx, `UPDATE arap.requests SET subject = jsonb_set(subject, '{id}', to_jsonb($2::text)) WHERE id = $1`, r.ID, "b\u200bob")
	require.NoError(t, err)
	_, err = f.svc.Decide(ctx, bob, r.ID, requests.Decision{Approve: true})
	require.Equal(t, authzen.ProblemIneligibleApprover, requests.ErrorCode(err), "%v", err)
	votes, err := f.svc.Votes(ctx, r.ID)
	require.NoError(t, err)
	require.Empty(t, votes)
}

// TestNonCanonicalIdentifiersAreRefused: at evaluation and at submission, a
// subject or actor id that is not canonical is a 400 naming the problem,
// never silently accepted, and nothing is recorded.
func TestNonCanonicalIdentifiersAreRefused(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	wire := map[string]any{"to": "acct-991", "amount": 50000}
	bad := map[string]string{
		" bob": "whitespace", "bob ": "whitespace", "b\u200bob": "U+200B ZERO WIDTH SPACE", "\u202ebob": "U+202E",
		"ｂｏｂ": "NFKC", "b\u00a0ob": "NFKC", "bo\u00adb": "U+00AD", "b\tob": "U+0009", "": "empty",
	}
	for id, want := range bad {
		for _, where := range []string{"subject.id", "subject.properties.act.sub", "subject.properties.act.act.sub"} {
			t.Run(fmt.Sprintf("%s %q", where, id), func(t *testing.T) {
				req := toolCall("wire_transfer", wire)
				switch where {
				case "subject.id":
					req.Subject["id"] = id
				case "subject.properties.act.sub":
					req = withActors(req, chain(id))
				default:
					req = withActors(req, chain("agent:demo", id))
				}
				v := evaluation.ValidateRequest(req)
				require.NotEmpty(t, v)
				require.Contains(t, fmt.Sprint(v), where)
				require.Contains(t, fmt.Sprint(v), want)

				// A submission carrying it (with a genuine denial for the
				// canonical call) is refused before anything else.
				good := toolCall("wire_transfer", wire)
				d, hint := f.deny(f.pep, good)
				body := submission(good, d, hint)
				body["subject"] = req.Subject
				before := count(t, f, "arap.requests")
				_, err := f.svc.Submit(ctx, f.pep, "", mustJSON(t, body))
				require.Equal(t, authzen.ProblemInvalidRequest, requests.ErrorCode(err), "%v", err)
				require.Contains(t, err.Error(), want)
				require.Equal(t, before, count(t, f, "arap.requests"))
			})
		}
	}
	// client.actor too.
	body := patch(f.fresh("wire_transfer", wire), "client", map[string]any{"actor": map[string]any{"id": "agent:demo\u200b"}})
	_, err := f.svc.Submit(ctx, f.pep, "", body)
	require.Equal(t, authzen.ProblemInvalidRequest, requests.ErrorCode(err), "%v", err)
	require.Contains(t, err.Error(), "client.actor: the actor identifier contains U+200B")
	// Opaque ids stay valid.
	for _, id := range []string{"YWxpY2U=", "AbC123xyz", "248289761001", "https://idp.example.com/u/1"} {
		req := toolCall("wire_transfer", wire)
		req.Subject["id"] = id
		require.Empty(t, evaluation.ValidateRequest(req), id)
	}
	require.Zero(t, count(t, f, "arap.requests"))
}

// TestActorChainIsBound: the agent is part of what is approved. A
// submission through another agent, through none, or through a longer
// chain does not match the denial; an approval for alice via agent:demo
// is out of scope for alice via anyone else.
func TestActorChainIsBound(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	ctx := context.Background()
	wire := map[string]any{"to": "acct-991", "amount": 50000}

	for name, act := range map[string]map[string]any{
		"another agent": chain("agent:other"), "no agent": nil, "a longer chain": chain("agent:demo", "agent:sub"),
	} {
		t.Run("submission through "+name, func(t *testing.T) {
			req := toolCall("wire_transfer", wire)
			d, hint := f.deny(f.pep, req)
			body := submission(withActors(req, act), d, hint)
			_, err := f.svc.Submit(ctx, f.pep, "", mustJSON(t, body))
			require.Equal(t, authzen.ProblemInvalidDenialBinding, requests.ErrorCode(err), "%v", err)
			require.Contains(t, err.Error(), "actor chain")
		})
	}
	t.Run("a denial without an agent, submitted with one", func(t *testing.T) {
		req := withActors(toolCall("wire_transfer", wire), nil)
		d, hint := f.deny(f.pep, req)
		_, err := f.svc.Submit(ctx, f.pep, "", mustJSON(t, submission(withActors(req, chain("agent:demo")), d, hint)))
		require.Equal(t, authzen.ProblemInvalidDenialBinding, requests.ErrorCode(err), "%v", err)
	})
	require.Zero(t, count(t, f, "arap.requests"))

	call, approval := f.approved(bob, "wire_transfer", wire)
	require.True(t, f.reevaluate(f.pepID, call, approval).Decision)
	for name, act := range map[string]map[string]any{
		"another agent": chain("agent:other"), "no agent": nil, "a longer chain": chain("agent:demo", "agent:sub"),
		"the agent with another issuer": {"sub": "agent:demo", "iss": "https://other.example"},
	} {
		t.Run("re-evaluation through "+name, func(t *testing.T) {
			requireDeny(t, f.reevaluate(f.pepID, withActors(call, act), approval), authzen.ReasonOutOfScope, authzen.NextActionRequest)
		})
	}
	// The approval for alice via agent:demo still works, and a second
	// approval of the same call through another agent does not supersede it.
	require.True(t, f.reevaluate(f.pepID, call, approval).Decision)
	other := withActors(toolCall("wire_transfer", wire), chain("agent:other"))
	d, hint := f.deny(f.pep, other)
	res, err := f.svc.Submit(ctx, f.pep, "", mustJSON(t, submission(other, d, hint)))
	require.NoError(t, err)
	_, err = f.svc.Decide(ctx, bob, res.Request.ID, requests.Decision{Approve: true})
	require.NoError(t, err)
	require.True(t, f.reevaluate(f.pepID, call, approval).Decision, "an approval through another agent is another approval")
}

// TestActorChainDepth: a chain deeper than authzen.MaxActorDepth is
// refused at evaluation and submission; one at the limit is accepted, and
// the actor allow-list and separation of duties both reach its last link.
func TestActorChainDepth(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	ctx := context.Background()
	wire := map[string]any{"to": "acct-991", "amount": 50000}
	ids := func(n int, last string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("agent:a%d", i)
		}
		out[n-1] = last
		return out
	}

	deep := withActors(toolCall("wire_transfer", wire), chain(ids(authzen.MaxActorDepth+1, "agent:z")...))
	v := evaluation.ValidateRequest(deep)
	require.Contains(t, fmt.Sprint(v), "deeper than")
	for _, bad := range []any{"agent:demo", []any{"agent:demo"}, map[string]any{"id": "agent:demo"}, map[string]any{"sub": 7},
		map[string]any{"sub": "agent:demo", "act": nil}, map[string]any{"sub": "agent:demo", "act": "agent:x"}} {
		req := toolCall("wire_transfer", wire)
		req.Subject = authzen.Object{"type": "user", "id": "alice", "properties": map[string]any{"act": bad}}
		require.NotEmpty(t, evaluation.ValidateRequest(req), "%v", bad)
	}
	// client.actor deeper than the limit: refused, nothing recorded.
	var clientChain map[string]any
	for i := authzen.MaxActorDepth; i >= 0; i-- {
		link := map[string]any{"sub": fmt.Sprintf("agent:c%d", i)}
		if i == 0 {
			link = map[string]any{"id": "agent:c0"}
		}
		if clientChain != nil {
			link["act"] = clientChain
		}
		clientChain = link
	}
	_, err := f.svc.Submit(ctx, f.pep, "", patch(f.fresh("wire_transfer", wire), "client", map[string]any{"actor": clientChain}))
	require.Equal(t, authzen.ProblemInvalidRequest, requests.ErrorCode(err), "%v", err)
	require.Contains(t, err.Error(), "deeper than")

	// At the limit: the allow-list checks the last link...
	atLimit := withActors(toolCall("wire_transfer", wire), chain(ids(authzen.MaxActorDepth, "user:root")...))
	require.Empty(t, evaluation.ValidateRequest(atLimit))
	d, hint := f.deny(f.pep, atLimit)
	_, err = f.svc.Submit(ctx, f.pep, "", mustJSON(t, submission(atLimit, d, hint)))
	require.Equal(t, authzen.ProblemActorNotAuthorized, requests.ErrorCode(err), "%v", err)
	require.Contains(t, err.Error(), `"user:root"`)

	// ...and separation of duties does too.
	lax := f.caller(clients.NewStore(f.db), "any-actor-pep", []string{"*"})
	viaBob := withActors(toolCall("wire_transfer", wire), chain(ids(authzen.MaxActorDepth, "user:bob")...))
	d, hint = f.deny(lax, viaBob)
	res, err := f.svc.Submit(ctx, lax, "", mustJSON(t, submission(viaBob, d, hint)))
	require.NoError(t, err)
	_, err = f.svc.Decide(ctx, bob, res.Request.ID, requests.Decision{Approve: true})
	require.Equal(t, authzen.ProblemIneligibleApprover, requests.ErrorCode(err), "%v", err)
	require.Contains(t, err.Error(), "user:bob")
	require.Equal(t, 1, count(t, f, "arap.requests"))
}

// TestSeparationOfDutiesThroughSubmittedChains: bob named anywhere in the
// chains a PEP submits (deep in subject.properties.act, or in client.actor
// and its act chain) is kept with the request and leaves him unable to
// decide it or to revoke its approval; carol, named nowhere, decides it.
// Eligible's own tests build the stored request by hand; this goes through
// Submit and storage.
func TestSeparationOfDutiesThroughSubmittedChains(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	ctx := context.Background()
	lax := f.caller(clients.NewStore(f.db), "any-actor-pep", []string{"*"})
	deep := make([]string, authzen.MaxActorDepth)
	for i := range deep {
		deep[i] = fmt.Sprintf("agent:a%d", i)
	}
	deep[len(deep)-1] = "user:bob"
	cases := map[string]struct {
		act    map[string]any // subject.properties.act
		client map[string]any // client.actor
	}{
		"second link of the subject's chain":  {act: chain("agent:demo", "bob")},
		"last link of a chain at the limit":   {act: chain(deep...)},
		"client.actor":                        {act: chain("agent:demo"), client: map[string]any{"id": "user:bob"}},
		"second link of client.actor's chain": {act: chain("agent:demo"), client: map[string]any{"id": "agent:demo", "act": map[string]any{"sub": "BOB@example.com"}}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			call := withActors(toolCall("wire_transfer", map[string]any{"to": "acct-991", "amount": 50000}), tc.act)
			d, hint := f.deny(lax, call)
			body := submission(call, d, hint)
			if tc.client != nil {
				body["client"] = map[string]any{"actor": tc.client}
			}
			res, err := f.svc.Submit(ctx, lax, "", mustJSON(t, body))
			require.NoError(t, err)
			id := res.Request.ID
			stored, err := f.svc.Get(ctx, lax, id)
			require.NoError(t, err)
			ok, why := requests.MayDecide(bob, stored, nil, time.Now())
			require.False(t, ok, "the stored request still names bob")
			require.Contains(t, why, "on their behalf or through them")

			_, err = f.svc.Decide(ctx, bob, id, requests.Decision{Approve: true})
			require.Equal(t, authzen.ProblemIneligibleApprover, requests.ErrorCode(err), "%v", err)
			votes, err := f.svc.Votes(ctx, id)
			require.NoError(t, err)
			require.Empty(t, votes, "a refused vote records nothing")

			decided, err := f.svc.Decide(ctx, carol, id, requests.Decision{Approve: true})
			require.NoError(t, err)
			require.Equal(t, requests.Approved, decided.Status)
			_, err = f.svc.Revoke(ctx, bob, id, "")
			require.Equal(t, authzen.ProblemIneligibleApprover, requests.ErrorCode(err), "%v", err)
		})
	}
}
