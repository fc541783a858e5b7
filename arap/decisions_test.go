package arap_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dev"
)

// TestDecisionAPIFlow is the by-hand check as a test: submit, find it
// as an ITSM system, approve it through the API, read the status, re-evaluate
// with the approval: allow.
func TestDecisionAPIFlow(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{})
	pep := api{t: t, base: env.URL, token: dev.PEPToken}
	itsm := api{t: t, base: env.URL, token: dev.ITSMToken}
	resolver := api{t: t, base: env.URL, token: dev.ResolverToken}

	call := wireCall(50000)
	r := pep.do("POST", "/access/v1/requests", submission(t, call, pep.do("POST", "/access/v1/evaluation", call).json(t)))
	require.Equal(t, 202, r.status)
	id := r.json(t)["task"].(map[string]any)["id"].(string)

	// The ITSM system finds the work.
	r = itsm.do("GET", "/v1/requests?status=pending", nil)
	require.Equal(t, 200, r.status, "%s", r.body)
	list := r.json(t)["requests"].([]any)
	require.Len(t, list, 1)
	view := list[0].(map[string]any)
	require.Equal(t, id, view["id"])
	require.Equal(t, true, view["you_may_decide"])
	require.Equal(t, 50000.0, view["resource"].(map[string]any)["properties"].(map[string]any)["arguments"].(map[string]any)["amount"],
		"deciders see exactly what they approve")

	// The automated resolver is not named by the treasury rule: it sees nothing.
	require.Empty(t, resolver.do("GET", "/v1/requests?status=pending", nil).json(t)["requests"])
	resolver.do("GET", "/v1/requests/"+id, nil).problem(t, 404, authzen.ProblemUnknownTask)
	resolver.do("POST", "/v1/requests/"+id+"/decisions", map[string]any{"decision": "approve"}).problem(t, 404, authzen.ProblemUnknownTask)
	// The PEP has no decide scope.
	pep.do("POST", "/v1/requests/"+id+"/decisions", map[string]any{"decision": "approve"}).problem(t, 403, authzen.ProblemInsufficientScope)

	itsm.do("POST", "/v1/requests/"+id+"/decisions", map[string]any{"decision": "maybe"}).problem(t, 400, authzen.ProblemInvalidRequest)
	late := time.Now().Add(48 * time.Hour).UTC().Format(time.RFC3339)
	itsm.do("POST", "/v1/requests/"+id+"/decisions", map[string]any{"decision": "approve", "approved_until": late}).problem(t, 400, authzen.ProblemInvalidRequest)

	r = itsm.do("POST", "/v1/requests/"+id+"/decisions", map[string]any{"decision": "approve", "reason": "CHG0042 approved"})
	require.Equal(t, 200, r.status, "%s", r.body)
	view = r.json(t)
	require.Equal(t, "approved", view["status"])
	require.Equal(t, "client:dev-itsm", view["votes"].([]any)[0].(map[string]any)["voter"])
	require.Equal(t, "itsm", view["votes"].([]any)[0].(map[string]any)["kind"])
	require.NotContains(t, string(r.body), `"state"`, "deciders never see approval.state")
	itsm.do("POST", "/v1/requests/"+id+"/decisions", map[string]any{"decision": "deny"}).problem(t, 409, authzen.ProblemInvalidTaskState)

	// The PEP reads the status: approved, with a reevaluate result.
	r = pep.do("GET", "/access/v1/requests/"+id, nil)
	require.Equal(t, 200, r.status)
	resp := r.json(t)
	require.Equal(t, "approved", resp["task"].(map[string]any)["status"])
	result := resp["result"].(map[string]any)
	require.Equal(t, "reevaluate", result["mode"])
	approval := result["approval"].(map[string]any)
	for _, k := range []string{"id", "approved_at", "approved_until", "state"} {
		require.NotEmpty(t, approval[k], k)
	}

	// Re-evaluation with the approval: allow.
	reeval := wireCall(50000)
	reeval["context"] = map[string]any{"approval": approval}
	r = pep.do("POST", "/access/v1/evaluation", reeval)
	require.Equal(t, 200, r.status)
	d := r.json(t)
	allowed := d
	require.Equal(t, true, d["decision"], "%v", d)
	require.Equal(t, approval["approved_until"], d["context"].(map[string]any)["approval"].(map[string]any)["approved_until"])

	// Different arguments with the same approval: out_of_scope.
	reeval = wireCall(90000)
	reeval["context"] = map[string]any{"approval": approval}
	d = pep.do("POST", "/access/v1/evaluation", reeval).json(t)
	require.Equal(t, false, d["decision"])
	require.Equal(t, "out_of_scope", d["context"].(map[string]any)["reason"])
	require.Equal(t, "request", d["context"].(map[string]any)["next_action"])
	require.NotNil(t, d["context"].(map[string]any)["access_request"])

	// The approval was used (the allow above): a revocation now is
	// refused, saying when and by which evaluation, since the call it
	// allowed may be running (requests.TestRevocation* for the rest).
	r = itsm.do("POST", "/v1/approvals/"+approval["id"].(string)+"/revoke", map[string]any{"reason": "wrong beneficiary"})
	require.Equal(t, 409, r.status, "%s", r.body)
	p := r.json(t)
	require.Equal(t, authzen.ProblemType(authzen.ProblemApprovalAlreadyUsed), p["type"])
	require.Equal(t, allowed["context"].(map[string]any)["evaluation_id"], p["evaluation_id"], "%v", p)
	require.NotEmpty(t, p["used_at"])
	reeval = wireCall(50000)
	reeval["context"] = map[string]any{"approval": approval}
	require.Equal(t, true, pep.do("POST", "/access/v1/evaluation", reeval).json(t)["decision"])
}

func TestAutomatedResolverRunsAsAJob(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{Policy: []byte(`version: 1
rules:
  - name: deploy_service
    match: {resource_id: deploy_service}
    effect: request
    approval:
      kinds: [automation]
      resolvers:
        - name: always
          when: "true"
          decision: approve
          reason: automatic
`)})
	pep := api{t: t, base: env.URL, token: dev.PEPToken}
	call := wireCall(0)
	call["resource"] = map[string]any{"type": "mcp_tool", "id": "deploy_service", "properties": map[string]any{"arguments": map[string]any{"service": "api", "version": "2"}}}
	r := pep.do("POST", "/access/v1/requests", submission(t, call, pep.do("POST", "/access/v1/evaluation", call).json(t)))
	require.Equal(t, 202, r.status)
	id := r.json(t)["task"].(map[string]any)["id"].(string)
	require.Eventually(t, func() bool {
		return pep.do("GET", "/access/v1/requests/"+id, nil).json(t)["task"].(map[string]any)["status"] == "approved"
	}, 30*time.Second, 100*time.Millisecond)
}

const displayPolicy = `version: 1
rules:
  - name: expense
    match: {resource_id: expense}
    effect: request
    approval: {kinds: [itsm]}
    request_schema:
      type: object
      properties:
        context:
          type: object
          properties:
            ticket: {type: string}
`

// TestRequestViewMarksHiddenCharactersAndExtraContext: the decision API
// lists every character a person could not see or could mistake, where it
// is, and keeps the context members the rule did not ask for apart from
// the ones it did.
func TestRequestViewMarksHiddenCharactersAndExtraContext(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{Policy: []byte(displayPolicy)})
	pep := api{t: t, base: env.URL, token: dev.PEPToken}
	itsm := api{t: t, base: env.URL, token: dev.ITSMToken}
	call := wireCall(0)
	call["resource"] = map[string]any{"type": "mcp_tool", "id": "expense", "properties": map[string]any{"arguments": map[string]any{
		"to": "acct-\u202e199\u202c", "p\u0430yee": "ok", "amount": 10}}}
	body := submission(t, call, pep.do("POST", "/access/v1/evaluation", call).json(t))
	body["context"] = map[string]any{"ticket": "CHG1", "approved_by": "CFO"}
	r := pep.do("POST", "/access/v1/requests", body)
	require.Equal(t, 202, r.status, "%s", r.body)
	id := r.json(t)["task"].(map[string]any)["id"].(string)

	view := itsm.do("GET", "/v1/requests/"+id, nil).json(t)
	require.Equal(t, map[string]any{"ticket": "CHG1"}, view["context"], "only what the rule asked for")
	require.Equal(t, map[string]any{"approved_by": "CFO"}, view["extra_context"], "the rest, apart")
	var got []string
	for _, h := range view["hidden_characters"].([]any) {
		h := h.(map[string]any)
		got = append(got, h["pointer"].(string)+" "+h["code"].(string)+" "+h["name"].(string)+
			" at "+strconv.Itoa(int(h["offset"].(float64)))+map[bool]string{true: " in name", false: ""}[h["in_name"] == true])
	}
	require.Equal(t, []string{
		"/resource/properties/arguments/p\u0430yee U+0430 CYRILLIC SMALL LETTER A (Cyrillic in a Latin word) at 1 in name",
		"/resource/properties/arguments/to U+202E RIGHT-TO-LEFT OVERRIDE at 5",
		"/resource/properties/arguments/to U+202C POP DIRECTIONAL FORMATTING at 11",
	}, got)

	// A clean request has no list at all.
	call["resource"] = map[string]any{"type": "mcp_tool", "id": "expense", "properties": map[string]any{"arguments": map[string]any{"to": "acct-991"}}}
	r = pep.do("POST", "/access/v1/requests", submission(t, call, pep.do("POST", "/access/v1/evaluation", call).json(t)))
	require.Equal(t, 202, r.status, "%s", r.body)
	view = itsm.do("GET", "/v1/requests/"+r.json(t)["task"].(map[string]any)["id"].(string), nil).json(t)
	require.NotContains(t, view, "hidden_characters")
	require.NotContains(t, view, "extra_context")
}
