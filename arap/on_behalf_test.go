package arap_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dev"
)

// onBehalfPolicy: transfers need two people of treasury (an ITSM client may
// vote too, as a machine); repository deletion is web-only; deployments are
// decided only through a client on a person's behalf.
const onBehalfPolicy = `version: 1
rules:
  - name: two_people
    match: {resource_id: wire_transfer}
    effect: request
    approval:
      quorum: 2
      require_humans: 2
      groups: [treasury]
      kinds: [itsm]
  - name: web_only
    match: {resource_id: delete_repository}
    effect: request
    approval:
      groups: [platform]
      kinds: [itsm]
      channels: [web]
  - name: on_behalf_only
    match: {resource_id: deploy_service}
    effect: request
    approval:
      groups: [platform]
      kinds: [itsm]
      channels: [on_behalf]
`

func callFor(subject, tool string, args map[string]any) map[string]any {
	return map[string]any{
		"subject":  map[string]any{"type": "user", "id": subject, "properties": map[string]any{"act": map[string]any{"sub": "agent:demo"}}},
		"action":   map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": tool, "properties": map[string]any{"arguments": args}},
	}
}

func decideBody(decision, person string) map[string]any {
	b := map[string]any{"decision": decision}
	if person != "" {
		b["on_behalf_of"] = person
	}
	return b
}

// voteEvent is an audit event of kind vote.*.
type voteEvent struct {
	Actor string
	Data  map[string]any
}

// votesAndEvents reads what a request holds: its votes, and its audit
// events of kind vote.*.
func votesAndEvents(t *testing.T, env *backendtest.Env, id string) (int, []voteEvent) {
	t.Helper()
	votes, err := env.Backend.Requests().Votes(context.Background(), id)
	require.NoError(t, err)
	chain, err := audit.Chain(context.Background(), env.Pool, id)
	require.NoError(t, err)
	var events []voteEvent
	for _, e := range chain {
		if strings.HasPrefix(e.Kind, "vote.") {
			ev := voteEvent{Actor: e.Actor}
			require.NoError(t, json.Unmarshal(e.Data, &ev.Data))
			events = append(events, ev)
		}
	}
	return len(votes), events
}

// TestOnBehalfVoteCountsAsThePerson: a vote on_behalf_of bob is bob's, a
// human vote toward require_humans (the ITSM client's own vote is not);
// bob cannot vote twice through it; the vote and its audit event name both
// the person and the client it came through.
func TestOnBehalfVoteCountsAsThePerson(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{Policy: []byte(onBehalfPolicy)})
	itsm := api{t: t, base: env.URL, token: dev.ITSMToken}
	id := env.Submit(t, callFor("alice", "wire_transfer", map[string]any{"to": "acct-991", "amount": 50000}))
	path := "/v1/requests/" + id + "/decisions"

	r := itsm.do("POST", path, map[string]any{"decision": "approve", "reason": "CHG0042", "on_behalf_of": "bob"})
	require.Equal(t, 200, r.status, "%s", r.body)
	view := r.json(t)
	require.Equal(t, "pending", view["status"])
	progress := view["progress"].(map[string]any)
	require.EqualValues(t, 1, progress["approvals"])
	require.EqualValues(t, 1, progress["human_approvals"], "bob's vote through the client is a person's vote")
	vote := view["votes"].([]any)[0].(map[string]any)
	require.Equal(t, "user:bob", vote["voter"])
	require.Equal(t, "human", vote["kind"])
	require.Equal(t, "on_behalf", vote["channel"])
	require.Equal(t, "dev-itsm", vote["via"].(map[string]any)["client"])
	require.Equal(t, "itsm", vote["via"].(map[string]any)["kind"])
	require.Equal(t, false, view["you_may_decide"], "the answer speaks for bob, who has voted")

	// One vote per person, whichever way it comes.
	itsm.do("POST", path, decideBody("approve", "bob")).problem(t, 409, authzen.ProblemAlreadyDecided)

	// The client's own vote is a machine's: two approvals, one person.
	r = itsm.do("POST", path, decideBody("approve", ""))
	require.Equal(t, 200, r.status, "%s", r.body)
	view = r.json(t)
	require.Equal(t, "pending", view["status"], "require_humans: 2 is not met by bob and a machine")
	require.EqualValues(t, 2, view["progress"].(map[string]any)["approvals"])
	require.EqualValues(t, 1, view["progress"].(map[string]any)["human_approvals"])
	require.Equal(t, "api", view["votes"].([]any)[1].(map[string]any)["channel"])

	// Carol through the same client: the second person; approved.
	r = itsm.do("POST", path, decideBody("approve", "carol"))
	require.Equal(t, 200, r.status, "%s", r.body)
	require.Equal(t, "approved", r.json(t)["status"])

	// The stored votes and the audit trail name the person and the client.
	n, events := votesAndEvents(t, env, id)
	require.Equal(t, 3, n)
	require.Len(t, events, 3)
	itsmClient, err := env.Backend.Clients().Get(context.Background(), "dev-itsm")
	require.NoError(t, err)
	for i, want := range []string{"user:bob", "client:dev-itsm", "user:carol"} {
		require.Equal(t, want, events[i].Actor)
	}
	for _, i := range []int{0, 2} {
		require.Equal(t, "on_behalf", events[i].Data["channel"])
		require.Equal(t, "human", events[i].Data["voter_kind"])
		require.Equal(t, itsmClient.ID, events[i].Data["via_client_id"])
		require.Equal(t, "dev-itsm", events[i].Data["via_client"])
		require.Equal(t, "itsm", events[i].Data["via_client_kind"])
	}
	require.Equal(t, "api", events[1].Data["channel"])
	require.NotContains(t, events[1].Data, "via_client")
	require.Equal(t, "CHG0042", events[0].Data["reason"])
	votes, err := env.Backend.Requests().Votes(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, "dev-itsm", votes[0].Via.Client)
	require.Equal(t, itsmClient.ID, votes[0].Via.ClientID)
}

// TestOnBehalfRefusalsRecordNothing: the person's ineligibility (not among
// the deciders; the request is theirs), an unknown or disabled person, a
// client without decide_for_people: each a specific problem, and nothing is
// recorded.
func TestOnBehalfRefusalsRecordNothing(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{Policy: []byte(onBehalfPolicy)})
	ctx := context.Background()
	itsm := api{t: t, base: env.URL, token: dev.ITSMToken}
	resolver := api{t: t, base: env.URL, token: dev.ResolverToken}
	forPeopleOnly, forPeopleToken, err := env.Backend.Clients().Create(ctx, clients.New{Name: "bot-no-decide",
		Scopes: []string{clients.ScopeDecideForPeople}, Kind: clients.KindITSM}, "test")
	require.NoError(t, err)
	require.NotEmpty(t, forPeopleOnly.ID)
	bot := api{t: t, base: env.URL, token: forPeopleToken}
	// A client that may use the decision API (and is named by the rule,
	// kind itsm) but not for people.
	_, plainToken, err := env.Backend.Clients().Create(ctx, clients.New{Name: "itsm-plain",
		Scopes: []string{clients.ScopeDecide}, Kind: clients.KindITSM}, "test")
	require.NoError(t, err)
	plain := api{t: t, base: env.URL, token: plainToken}
	require.NoError(t, env.Backend.Directory().DisableUser(ctx, "carol", "test"))

	alices := env.Submit(t, callFor("alice", "wire_transfer", map[string]any{"to": "acct-991", "amount": 50000}))
	bobs := env.Submit(t, callFor("bob", "wire_transfer", map[string]any{"to": "acct-991", "amount": 60000}))
	dec := func(id string) string { return "/v1/requests/" + id + "/decisions" }

	// Not among the deciders: dave is platform, not treasury.
	p := itsm.do("POST", dec(alices), decideBody("approve", "dave")).problem(t, 403, authzen.ProblemIneligibleApprover)
	require.Contains(t, p["detail"], "user:dave is not among the deciders")
	// The subject, through a bot: no self-approval.
	p = itsm.do("POST", dec(bobs), decideBody("approve", "bob")).problem(t, 403, authzen.ProblemIneligibleApprover)
	require.Contains(t, p["detail"], "made on their behalf or through them")
	// Nor a deny of one's own request.
	itsm.do("POST", dec(bobs), decideBody("deny", "bob")).problem(t, 403, authzen.ProblemIneligibleApprover)

	// Unknown, disabled or malformed people.
	p = itsm.do("POST", dec(alices), decideBody("approve", "nobody")).problem(t, 422, authzen.ProblemUnknownPerson)
	require.Contains(t, p["detail"], `"nobody"`)
	itsm.do("POST", dec(alices), decideBody("approve", "Bob@")).problem(t, 422, authzen.ProblemUnknownPerson)
	p = itsm.do("POST", dec(alices), decideBody("approve", "carol")).problem(t, 422, authzen.ProblemUnknownPerson)
	require.Contains(t, p["detail"], "disabled")
	itsm.do("POST", dec(alices), map[string]any{"decision": "approve", "on_behalf_of": ""}).problem(t, 400, authzen.ProblemInvalidRequest)
	itsm.do("POST", dec(alices), map[string]any{"decision": "approve", "on_behalf_of": "b\u200bob"}).problem(t, 400, authzen.ProblemInvalidRequest)

	// Without the scope: 403, whoever the person is.
	r := plain.do("POST", dec(alices), decideBody("approve", "bob"))
	p = r.problem(t, 403, authzen.ProblemInsufficientScope)
	require.Contains(t, p["detail"], "decide_for_people")
	require.Contains(t, r.header.Get("WWW-Authenticate"), `scope="decide_for_people"`)
	resolver.do("POST", dec(alices), decideBody("approve", "bob")).problem(t, 403, authzen.ProblemInsufficientScope)
	// decide_for_people without decide does not open the decision API.
	bot.do("POST", dec(alices), decideBody("approve", "bob")).problem(t, 403, authzen.ProblemInsufficientScope)

	for _, id := range []string{alices, bobs} {
		n, events := votesAndEvents(t, env, id)
		require.Zero(t, n, "nothing recorded on %s", id)
		require.Empty(t, events)
		req, err := env.Backend.Requests().Load(ctx, id)
		require.NoError(t, err)
		require.Equal(t, "pending", string(req.Status))
	}

	// The same person, eligible, through the same client: recorded.
	r = itsm.do("POST", dec(alices), decideBody("approve", "bob"))
	require.Equal(t, 200, r.status, "%s", r.body)
	n, _ := votesAndEvents(t, env, alices)
	require.Equal(t, 1, n)
}

// TestOnBehalfChannelIsHeldToTheClientsOwnSeparation: a client may not carry
// a person's decision on a request it submitted.
func TestOnBehalfChannelIsHeldToTheClientsOwnSeparation(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{Policy: []byte(onBehalfPolicy)})
	ctx := context.Background()
	pep, err := env.Backend.Clients().Get(ctx, "dev-pep")
	require.NoError(t, err)
	// Give the PEP the decision scopes, as a careless operator might.
	_, err = env.Pool.Exec(ctx, `UPDATE arap.api_clients SET scopes = scopes || '{decide,decide_for_people}' WHERE id = $1`, pep.ID)
	require.NoError(t, err)
	id := env.Submit(t, callFor("alice", "wire_transfer", map[string]any{"to": "acct-991", "amount": 50000}))
	api{t: t, base: env.URL, token: dev.PEPToken}.do("POST", "/v1/requests/"+id+"/decisions", decideBody("approve", "bob")).
		problem(t, 403, authzen.ProblemIneligibleApprover)
	n, events := votesAndEvents(t, env, id)
	require.Zero(t, n)
	require.Empty(t, events)
}
