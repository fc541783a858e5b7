package requests_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/attributes"
	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/requests"
)

// approved submits tool(args) for alice, has bob approve it, and returns the
// call and the approval object the PEP received.
func (f *fixture) approved(voter requests.Voter, tool string, args map[string]any) (authzen.EvaluationRequest, map[string]any) {
	f.t.Helper()
	call := toolCall(tool, args)
	d, hint := f.deny(f.pep, call)
	res, err := f.svc.Submit(context.Background(), f.pep, "", mustJSON(f.t, submission(call, d, hint)))
	require.NoError(f.t, err)
	r, err := f.svc.Decide(context.Background(), voter, res.Request.ID, requests.Decision{Approve: true})
	require.NoError(f.t, err)
	require.Equal(f.t, requests.Approved, r.Status)
	// The PEP reads the result from the status endpoint as JSON and returns
	// the approval object unchanged.
	var handle map[string]any
	require.NoError(f.t, jsonRoundTrip(r.Handle(f.svc.StatusEndpoint(r.ID)), &handle))
	return call, handle["result"].(map[string]any)["approval"].(map[string]any)
}

// reevaluate presents approval with call, as caller.
func (f *fixture) reevaluate(callerID string, call authzen.EvaluationRequest, approval map[string]any) authzen.Decision {
	f.t.Helper()
	c := authzen.EvaluationRequest{Subject: call.Subject, Resource: call.Resource, Action: call.Action, Context: authzen.Object{}}
	for k, v := range call.Context {
		c.Context[k] = v
	}
	c.Context["approval"] = approval
	out, err := f.engine.Evaluate(context.Background(), callerID, c)
	require.NoError(f.t, err)
	return out.Decision
}

func requireDeny(t *testing.T, d authzen.Decision, reason, next string) {
	t.Helper()
	require.False(t, d.Decision, "%+v", d)
	require.Equal(t, reason, d.Context[authzen.CtxReason], "%+v", d)
	require.Equal(t, next, d.Context[authzen.CtxNextAction])
	_, fresh := d.Context[authzen.CtxAccessRequest]
	require.Equal(t, next == authzen.NextActionRequest, fresh, "a request answer carries a fresh access_request, and only it")
}

func TestReevaluationAllowsOnlyWithinScopeAndTime(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	call, approval := f.approved(bob, "wire_transfer", map[string]any{"to": "acct-991", "amount": 50000})

	d := f.reevaluate(f.pepID, call, approval)
	require.True(t, d.Decision, "%+v", d)
	echo := d.Context[authzen.CtxApproval].(map[string]any)
	require.Equal(t, approval["id"], echo["id"])
	require.Equal(t, approval["approved_until"], echo["approved_until"], "allow echoes approved_until")
	// Reusable within scope until approved_until.
	require.True(t, f.reevaluate(f.pepID, call, approval).Decision)

	// Different arguments: out of scope, with a fresh access_request for them.
	other := toolCall("wire_transfer", map[string]any{"to": "acct-666", "amount": 50000})
	d = f.reevaluate(f.pepID, other, approval)
	requireDeny(t, d, authzen.ReasonOutOfScope, authzen.NextActionRequest)

	// Another subject: out of scope too.
	other = toolCall("wire_transfer", map[string]any{"to": "acct-991", "amount": 50000})
	other.Subject["id"] = "mallory"
	requireDeny(t, f.reevaluate(f.pepID, other, approval), authzen.ReasonOutOfScope, authzen.NextActionRequest)

	// After approved_until: expired, with a fresh access_request.
	f.clock.Advance(time.Hour + time.Second)
	d = f.reevaluate(f.pepID, call, approval)
	requireDeny(t, d, authzen.ReasonApprovalExpired, authzen.NextActionRequest)
	hint := d.Context[authzen.CtxAccessRequest].(authzen.AccessRequestHint)
	require.NotEmpty(t, hint.BindingToken)

	// Every re-evaluation is in the request's audit chain.
	events, err := audit.Chain(context.Background(), f.db, approvalRequest(t, f, approval))
	require.NoError(t, err)
	var evaluated int
	for _, e := range events {
		if e.Kind == "approval.evaluated" {
			evaluated++
		}
	}
	require.Equal(t, 5, evaluated)
}

func approvalRequest(t *testing.T, f *fixture, approval map[string]any) string {
	rec, err := (&requests.ApprovalStore{DB: f.db, Now: f.clock.Now}).Approval(context.Background(), approval["id"].(string))
	require.NoError(t, err)
	return rec.RequestID
}

func TestRevokedAndSupersededApprovalsExpire(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	ctx := context.Background()
	call, approval := f.approved(bob, "wire_transfer", map[string]any{"to": "a", "amount": 50000})
	_, err := f.svc.Revoke(ctx, carol, approval["id"].(string), "mistake")
	require.NoError(t, err)
	requireDeny(t, f.reevaluate(f.pepID, call, approval), authzen.ReasonApprovalExpired, authzen.NextActionRequest)

	// A newer approval of the same call supersedes the older one.
	call, first := f.approved(bob, "wire_transfer", map[string]any{"to": "b", "amount": 50000})
	_, second := f.approved(carol, "wire_transfer", map[string]any{"to": "b", "amount": 50000})
	requireDeny(t, f.reevaluate(f.pepID, call, first), authzen.ReasonApprovalExpired, authzen.NextActionRequest)
	require.True(t, f.reevaluate(f.pepID, call, second).Decision)
}

func TestPolicyChangeAfterApproval(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	call, approval := f.approved(bob, "wire_transfer", map[string]any{"to": "a", "amount": 50000})

	deny, err := evaluation.Parse("p.yaml", []byte("version: 1\nrules:\n  - name: no_wires\n    match: {resource_id: wire_transfer}\n    effect: deny\n"))
	require.NoError(t, err)
	f.engine.SetPolicy(deny)
	requireDeny(t, f.reevaluate(f.pepID, call, approval), authzen.ReasonPolicyDenied, authzen.NextActionNone)

	// The approval satisfies only the rule it was granted under.
	stricter, err := evaluation.Parse("p.yaml", []byte("version: 1\nrules:\n  - name: wire_transfer_board\n    match: {resource_id: wire_transfer}\n    effect: request\n    approval: {quorum: 3, groups: [board]}\n"))
	require.NoError(t, err)
	f.engine.SetPolicy(stricter)
	requireDeny(t, f.reevaluate(f.pepID, call, approval), authzen.ReasonOutOfScope, authzen.NextActionRequest)

	open, err := evaluation.Parse("p.yaml", []byte("version: 1\nrules:\n  - name: all\n    when: \"true\"\n    effect: allow\n"))
	require.NoError(t, err)
	f.engine.SetPolicy(open)
	require.True(t, f.reevaluate(f.pepID, call, approval).Decision)
}

func TestAttributesAreReReadAtReevaluation(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	ctx := context.Background()
	call, approval := f.approved(bob, "wire_transfer", map[string]any{"to": "a", "amount": 50000})
	p, err := evaluation.Parse("p.yaml", []byte(`version: 1
rules:
  - name: lockdown
    when: has(attributes.lockdown) && attributes.lockdown == true
    effect: deny
  - name: wire_transfer_large
    match: {resource_id: wire_transfer}
    effect: request
    approval: {groups: [treasury]}
`))
	require.NoError(t, err)
	f.engine.SetPolicy(p)
	require.True(t, f.reevaluate(f.pepID, call, approval).Decision)
	require.NoError(t, f.attrs.Set(ctx, "lockdown", true, "test", nil))
	requireDeny(t, f.reevaluate(f.pepID, call, approval), authzen.ReasonPolicyDenied, authzen.NextActionNone)
}

func TestGrantPending(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	call, approval := f.approved(bob, "provision", map[string]any{"what": "db"})
	d := f.reevaluate(f.pepID, call, approval)
	requireDeny(t, d, authzen.ReasonGrantPending, authzen.NextActionRetry)
	after := d.Context[authzen.CtxRetryAfter].(int)
	require.True(t, after > 0 && after <= 30, "retry_after %d", after)
	f.clock.Advance(31 * time.Second)
	require.True(t, f.reevaluate(f.pepID, call, approval).Decision)
}

func TestUnverifiableApprovals(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	call, approval := f.approved(bob, "wire_transfer", map[string]any{"to": "a", "amount": 50000})
	_, otherApproval := f.approved(bob, "wire_transfer", map[string]any{"to": "z", "amount": 70000})
	with := func(k string, v any) map[string]any {
		m := map[string]any{}
		for kk, vv := range approval {
			m[kk] = vv
		}
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	state := approval["state"].(string)
	i := strings.LastIndex(state, ".") - 5
	tampered := state[:i] + string(flipChar(state[i])) + state[i+1:]
	cases := map[string]struct {
		caller   string
		approval any
		detail   string
	}{
		"a known id alone":            {f.pepID, with("state", nil), "needs id and state"},
		"tampered state":              {f.pepID, with("state", tampered), "does not verify"},
		"state of another approval":   {f.pepID, with("state", otherApproval["state"]), "does not match"},
		"presented by another client": {f.other.ID, approval, "different client"},
		"an unknown id":               {f.pepID, with("id", "apr_UNKNOWN"), "does not match"},
		"a binding token as state":    {f.pepID, with("state", bindingTokenFor(f)), "wrong token type"},
		"not an object":               {f.pepID, "apr_x", "approval object"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := authzen.EvaluationRequest{Subject: call.Subject, Resource: call.Resource, Action: call.Action,
				Context: authzen.Object{"tenant": "acme", "approval": tc.approval}}
			out, err := f.engine.Evaluate(context.Background(), tc.caller, c)
			require.NoError(t, err)
			requireDeny(t, out.Decision, authzen.ReasonApprovalUnverifiable, authzen.NextActionNone)
			require.Contains(t, out.Decision.Context["detail"], tc.detail)
		})
	}
}

func bindingTokenFor(f *fixture) string {
	_, hint := f.deny(f.pep, toolCall("wire_transfer", map[string]any{"amount": 90000}))
	return hint.BindingToken
}

func flipChar(c byte) byte {
	if c == 'A' {
		return 'B'
	}
	return 'A'
}

// TestOutageIsNoVerdict: chaos run findings. While a decision's inputs
// cannot be read because the database is unreachable, the PDP answered as if
// they had been: with the approvals unreadable, re-evaluation said
// approval_unverifiable (next_action none); with the policy's attributes
// unreadable, evaluation said decision false (policy_error). The PEP then
// told callers "not allowed by policy" and ended approved calls
// denied-not-executed for a passing outage. An outage is no verdict: an
// error the PEP retries, on first evaluation and on re-evaluation; once the
// store answers, the decisions come back.
func TestOutageIsNoVerdict(t *testing.T) {
	// A database that refuses connections, as a stopped one does.
	down, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/arap?sslmode=disable&connect_timeout=2")
	require.NoError(t, err)
	defer down.Close()
	for _, unreadable := range []string{"approvals", "attributes"} {
		t.Run(unreadable, func(t *testing.T) {
			f := setupWith(t, "testdata/resolution.yaml")
			call, approval := f.approved(bob, "wire_transfer", map[string]any{"to": "acct-991", "amount": 50000})
			attrs, approvals := f.attrs, &requests.ApprovalStore{DB: f.db, Now: f.clock.Now}
			if unreadable == "approvals" {
				approvals.DB = down
			} else {
				attrs = attributes.NewStore(down)
			}
			engine, err := evaluation.New(evaluation.Options{PolicyFile: "testdata/resolution.yaml", Keys: f.keys, Issuer: issuer,
				RequestsURL: requestsURL, Now: f.clock.Now, SchemaURL: func(s string) string { return issuer + "/s/" + s },
				Attributes: attrs, Approvals: approvals})
			require.NoError(t, err)
			again := authzen.EvaluationRequest{Subject: call.Subject, Resource: call.Resource, Action: call.Action, Context: authzen.Object{"approval": approval}}
			out, err := engine.Evaluate(context.Background(), f.pepID, again)
			require.Error(t, err, "an outage is no verdict on re-evaluation: %+v", out.Decision)
			if unreadable == "attributes" {
				first := again
				first.Context = nil
				out, err = engine.Evaluate(context.Background(), f.pepID, first)
				require.Error(t, err, "an outage is no verdict on first evaluation: %+v", out.Decision)
			}
			require.True(t, f.reevaluate(f.pepID, call, approval).Decision, "allowed once the store can be read")
		})
	}
}
