package evaluation_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/signing"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

const (
	issuer      = "https://pdp.test"
	requestsURL = "https://pdp.test/access/v1/requests"
)

var fixed = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)

func setup(t testing.TB) (*evaluation.Engine, *signing.Keys) {
	t.Helper()
	keys, err := signing.Open(context.Background(), dbtest.New(t), signing.Options{MasterKey: make([]byte, 32)})
	require.NoError(t, err)
	e, err := evaluation.New(evaluation.Options{
		PolicyFile: "testdata/policy.yaml", Keys: keys, Issuer: issuer, RequestsURL: requestsURL,
		SchemaURL: func(tpl string) string { return issuer + "/access/v1/schemas/" + tpl },
		Now:       func() time.Time { return fixed },
	})
	require.NoError(t, err)
	return e, keys
}

func call(tool string, args map[string]any) authzen.EvaluationRequest {
	return authzen.EvaluationRequest{
		Subject:  authzen.Object{"type": "user", "id": "alice", "properties": map[string]any{"act": map[string]any{"sub": "agent:demo"}}},
		Action:   authzen.Object{"name": "tools/call"},
		Resource: authzen.Object{"type": "mcp_tool", "id": tool, "properties": map[string]any{"arguments": args}},
		Context:  authzen.Object{"tenant": "acme", "time": "2026-11-29T10:00:00Z"},
	}
}

func TestDecisions(t *testing.T) {
	e, _ := setup(t)
	ctx := context.Background()
	cases := []struct {
		name     string
		req      authzen.EvaluationRequest
		decision bool
		reason   string
		rule     string
	}{
		{"always allowed", call("get_balance", map[string]any{}), true, "", "get_balance"},
		{"small transfer", call("wire_transfer", map[string]any{"to": "a", "amount": 25000}), true, "", "wire_transfer_small"},
		{"over hard limit", call("wire_transfer", map[string]any{"to": "a", "amount": 2000000}), false, "amount_over_hard_limit", "wire_transfer_over_hard_limit"},
		{"unknown tool", call("format_disk", map[string]any{}), false, authzen.ReasonNoMatchingRule, ""},
		// A condition that cannot be evaluated denies: a rule that might have
		// denied is never skipped.
		{"bad argument type fails closed", call("wire_transfer", map[string]any{"to": "a", "amount": "lots"}), false, authzen.ReasonPolicyError, ""},
		{"missing argument fails closed", call("wire_transfer", map[string]any{"to": "a"}), false, authzen.ReasonPolicyError, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := e.Evaluate(ctx, "cli_test", tc.req)
			require.NoError(t, err)
			require.Equal(t, tc.decision, out.Decision.Decision)
			require.Equal(t, tc.rule, out.Rule)
			require.NotEmpty(t, out.Decision.Context.Str(authzen.CtxEvaluationID))
			require.NotContains(t, out.Decision.Context, authzen.CtxAccessRequest, "only request rules are requestable")
			if !tc.decision {
				require.Equal(t, tc.reason, out.Decision.Context.Str(authzen.CtxReason))
			}
		})
	}
}

func TestRequestableDenialCarriesVerifiableBinding(t *testing.T) {
	e, keys := setup(t)
	ctx := context.Background()
	req := call("wire_transfer", map[string]any{"to": "acct-991", "amount": 50000})
	out, err := e.Evaluate(ctx, "cli_test", req)
	require.NoError(t, err)
	d := out.Decision
	require.False(t, d.Decision, "a requestable denial is still a denial")
	require.Equal(t, authzen.ReasonApprovalRequired, d.Context[authzen.CtxReason])
	require.Equal(t, fixed, d.Context[authzen.CtxEvaluatedAt])
	hint := d.Context[authzen.CtxAccessRequest].(authzen.AccessRequestHint)
	require.Equal(t, fixed.Add(10*time.Minute), hint.ExpiresAt)
	require.Equal(t, "treasury_approval", hint.Template)
	require.Equal(t, "Treasury approval", hint.Display["title"])
	require.Empty(t, hint.RequestSchemaURL, "no schema, no schema URL")

	var claims evaluation.BindingClaims
	require.NoError(t, keys.Verify(ctx, signing.TypeBinding, hint.BindingToken, &claims))
	require.Equal(t, issuer, claims.Issuer)
	require.Equal(t, jwt.ClaimStrings{requestsURL}, claims.Audience)
	require.Equal(t, hint.ExpiresAt, claims.ExpiresAt.Time.UTC())
	require.Equal(t, hint.ExpiresAt.Format(time.RFC3339), claims.DenialExpiresAt)
	require.NotEmpty(t, claims.ID)
	require.Equal(t, d.Context[authzen.CtxEvaluationID], claims.EvaluationID)
	require.Equal(t, []string{"tenant"}, claims.BindingContextMembers)
	require.Equal(t, "treasury_approval", claims.Template)
	require.Equal(t, "cli_test", claims.AuthorizedParty)
	// The hash covers subject (without act), resource, action and the tenant
	// member only; the volatile time member is not bound.
	req.Context["time"] = "later"
	req.Subject["properties"] = map[string]any{"act": map[string]any{"sub": "someone-else"}}
	want, err := authzen.BindingHash(req.Subject, req.Resource, req.Action, req.Context, []string{"tenant"})
	require.NoError(t, err)
	require.Equal(t, want, claims.BindingHash)

	// Every denial gets its own jti and evaluation id.
	out2, err := e.Evaluate(ctx, "cli_test", req)
	require.NoError(t, err)
	var claims2 evaluation.BindingClaims
	require.NoError(t, keys.Verify(ctx, signing.TypeBinding, out2.Decision.Context[authzen.CtxAccessRequest].(authzen.AccessRequestHint).BindingToken, &claims2))
	require.NotEqual(t, claims.ID, claims2.ID)
	require.NotEqual(t, claims.EvaluationID, claims2.EvaluationID)
}

func TestRequestSchema(t *testing.T) {
	e, _ := setup(t)
	out, err := e.Evaluate(context.Background(), "cli_test", call("read_customer_record", map[string]any{"customer_id": "c-1"}))
	require.NoError(t, err)
	hint := out.Decision.Context[authzen.CtxAccessRequest].(authzen.AccessRequestHint)
	require.Equal(t, issuer+"/access/v1/schemas/read_customer_record", hint.RequestSchemaURL)
	require.Equal(t, fixed.Add(2*time.Minute), hint.ExpiresAt, "the rule's denial_ttl overrides the default")

	rule, ok := e.Policy().RuleForTemplate("read_customer_record")
	require.True(t, ok)
	require.Empty(t, rule.ValidateSubmission(map[string]any{"business_justification": "Renewal review for ACME"}, nil))
	v := rule.ValidateSubmission(map[string]any{"business_justification": "short"}, nil)
	require.Equal(t, []string{"context.business_justification: must be at least 10 characters; give a longer business justification"}, v,
		"the field as it is spelled, and what to do")
	v = rule.ValidateSubmission(nil, nil)
	require.Equal(t, []string{"context: is required; provide a context"}, v)
}

func TestBatchSemantics(t *testing.T) {
	e, _ := setup(t)
	ctx := context.Background()
	base := call("get_balance", map[string]any{})
	batch := authzen.EvaluationsRequest{
		Subject: base.Subject, Action: base.Action,
		Evaluations: []authzen.EvaluationRequest{
			{Resource: authzen.Object{"type": "mcp_tool", "id": "get_balance"}},
			{Resource: authzen.Object{"type": "mcp_tool", "id": "format_disk"}},
			{Resource: authzen.Object{"type": "mcp_tool", "id": "get_balance"}},
		},
	}
	decisions := func(semantic string) []bool {
		b := batch
		b.Options.EvaluationsSemantic = semantic
		require.Empty(t, evaluation.ValidateBatch(b))
		outs, err := e.EvaluateBatch(ctx, "cli_test", b)
		require.NoError(t, err)
		var ds []bool
		for _, o := range outs {
			ds = append(ds, o.Decision.Decision)
		}
		return ds
	}
	require.Equal(t, []bool{true, false, true}, decisions(""))
	require.Equal(t, []bool{true, false, true}, decisions(authzen.SemanticExecuteAll))
	require.Equal(t, []bool{true, false}, decisions(authzen.SemanticDenyOnFirstDeny))
	require.Equal(t, []bool{true}, decisions(authzen.SemanticPermitOnFirstPermit))

	// An item's member replaces the default whole.
	items := evaluation.Items(authzen.EvaluationsRequest{
		Subject:     authzen.Object{"type": "user", "id": "alice"},
		Evaluations: []authzen.EvaluationRequest{{Subject: authzen.Object{"type": "user", "id": "bob"}}},
	})
	require.Equal(t, "bob", items[0].Subject.Str("id"))

	bad := batch
	bad.Options.EvaluationsSemantic = "first_wins"
	bad.Evaluations = append(bad.Evaluations, authzen.EvaluationRequest{Action: authzen.Object{"verb": "x"}})
	v := evaluation.ValidateBatch(bad)
	require.Equal(t, []string{
		`options.evaluations_semantic: "first_wins" is not one of execute_all, deny_on_first_deny, permit_on_first_permit; use one of these`,
		"evaluations[3].action.name: is required; provide a name",
		"evaluations[3].resource: is required; provide a resource",
	}, v)
}

func TestValidateRequest(t *testing.T) {
	require.Empty(t, evaluation.ValidateRequest(call("get_balance", nil)))
	v := evaluation.ValidateRequest(authzen.EvaluationRequest{
		Subject:  authzen.Object{"type": "user"},
		Resource: authzen.Object{"type": 7, "id": "x"},
	})
	require.Equal(t, []string{
		"action: is required; provide an action",
		"resource.type: must be a string, not a number; send it as a string",
		"subject.id: is required; provide an id",
	}, v)
}

func TestPolicyErrorsHaveLines(t *testing.T) {
	doc := `version: 1
rules:
  - name: ok_rule
    match: {action: read}
    effect: allow
  - name: bad_cel
    when: resource.id ==
    effect: allow
  - name: bad_effect
    match: {action: read}
    effect: maybe
  - name: typo
    match: {action: read}
    efect: allow
  - name: ok_rule
    match: {action: read}
    effect: deny
  - name: bad_ttl
    match: {action: read}
    effect: request
    approval: {users: [bob]}
    denial_ttl: soon
`
	_, err := evaluation.Parse("p.yaml", []byte(doc))
	var perr *evaluation.Error
	require.ErrorAs(t, err, &perr)
	msg := err.Error()
	// The first error at decode time stops decoding, so line-level decode
	// errors and compile errors are reported in two passes; here the decode
	// error (unknown field) comes first.
	require.Contains(t, msg, "p.yaml:14:")
	require.Contains(t, msg, `unknown rule field "efect"`)

	doc = strings.Replace(doc, "efect", "effect", 1)
	doc = strings.Replace(doc, "denial_ttl: soon", "denial_ttl: 5m", 1)
	_, err = evaluation.Parse("p.yaml", []byte(doc))
	require.ErrorAs(t, err, &perr)
	msg = err.Error()
	require.Contains(t, msg, `p.yaml:7: rule "bad_cel": when:`)
	require.Contains(t, msg, `p.yaml:9: rule "bad_effect": effect must be allow, deny or request`)
	require.Contains(t, msg, `p.yaml:15: rule "ok_rule" is defined twice`)
	require.Len(t, perr.Problems, 3)
}

func TestReloadKeepsPolicyOnError(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "policy.yaml")
	good, err := os.ReadFile("testdata/policy.yaml")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(file, good, 0o600))
	keys, err := signing.Open(context.Background(), dbtest.New(t), signing.Options{MasterKey: make([]byte, 32)})
	require.NoError(t, err)
	e, err := evaluation.New(evaluation.Options{PolicyFile: file, Keys: keys, Issuer: issuer, RequestsURL: requestsURL})
	require.NoError(t, err)
	before := e.Policy()

	require.NoError(t, os.WriteFile(file, []byte("version: 1\nrules:\n  - name: x\n    when: 1 +\n    effect: allow\n"), 0o600))
	err = e.Reload()
	require.ErrorContains(t, err, "policy.yaml:4:")
	require.Same(t, before, e.Policy(), "a bad file leaves the running policy in place")

	require.NoError(t, os.WriteFile(file, []byte("version: 1\nrules:\n  - name: everything\n    when: \"true\"\n    effect: allow\n"), 0o600))
	require.NoError(t, e.Reload())
	out, err := e.Evaluate(context.Background(), "cli_test", call("format_disk", nil))
	require.NoError(t, err)
	require.True(t, out.Decision.Decision)
}

// TestApprovalChannels: approval.channels names the ways decisions may
// arrive; unknown, repeated or no names are refused at load with their
// lines, and a rule without it allows every channel (today's behaviour).
func TestApprovalChannels(t *testing.T) {
	doc := `version: 1
rules:
  - name: web_only
    match: {action: a}
    effect: request
    approval:
      users: [bob]
      channels: [web]
  - name: any_channel
    match: {action: b}
    effect: request
    approval: {users: [bob]}
`
	p, err := evaluation.Parse("p.yaml", []byte(doc))
	require.NoError(t, err)
	r, ok := p.Rule("web_only")
	require.True(t, ok)
	web := r.Approval
	require.Equal(t, []string{evaluation.ChannelWeb}, web.Channels)
	require.True(t, web.AllowsChannel(evaluation.ChannelWeb))
	require.False(t, web.AllowsChannel(evaluation.ChannelAPI))
	require.False(t, web.AllowsChannel(evaluation.ChannelOnBehalf))
	r, ok = p.Rule("any_channel")
	require.True(t, ok)
	anyc := r.Approval
	for _, c := range evaluation.AllChannels {
		require.True(t, anyc.AllowsChannel(c), c)
	}

	bad := `version: 1
rules:
  - name: typo
    match: {action: a}
    effect: request
    approval:
      users: [bob]
      channels:
        - web
        - slak
        - web
  - name: none
    match: {action: b}
    effect: request
    approval:
      users: [bob]
      channels: []
`
	_, err = evaluation.Parse("p.yaml", []byte(bad))
	var perr *evaluation.Error
	require.ErrorAs(t, err, &perr)
	msg := err.Error()
	require.Contains(t, msg, `p.yaml:10: rule "typo": approval.channels: unknown channel "slak" (known: web, api, on_behalf, slack)`)
	require.Contains(t, msg, `p.yaml:11: rule "typo": approval.channels: "web" is listed twice`)
	require.Contains(t, msg, `p.yaml:16: rule "none": approval.channels is empty`)
	require.Len(t, perr.Problems, 3)
}

// TestReminderAndEscalationFields: remind_every, escalate_after and
// escalate_to are parsed into the approval policy, and each misuse is
// refused at load with the file and the line of the offending field.
func TestReminderAndEscalationFields(t *testing.T) {
	rule := func(approval string) string {
		return "version: 1\nrules:\n  - name: r\n    match: {action: read}\n    effect: request\n    request_ttl: 2h\n    approval:\n      groups: [treasury]\n" + approval
	}
	p, err := evaluation.Parse("p.yaml", []byte(rule("      remind_every: 15m\n      escalate_after: 1h\n      escalate_to: treasury-leads\n")))
	require.NoError(t, err)
	r, ok := p.Rule("r")
	require.True(t, ok)
	a := r.Approval
	require.Equal(t, 15*time.Minute, a.RemindEvery)
	require.Equal(t, time.Hour, a.EscalateAfter)
	require.Equal(t, "treasury-leads", a.EscalateTo)

	for _, c := range []struct{ approval, want string }{
		{"      remind_every: 30s\n", `p.yaml:9: rule "r": approval.remind_every (30s) is shorter than 1m0s`},
		{"      remind_every: 3h\n", `p.yaml:9: rule "r": approval.remind_every (3h0m0s) is not shorter than request_ttl (2h0m0s)`},
		{"      remind_every: never\n", `p.yaml:9:`},
		{"      escalate_after: 1h\n", `p.yaml:9: rule "r": approval.escalate_after needs escalate_to`},
		{"      escalate_to: leads\n", `p.yaml:9: rule "r": approval.escalate_to needs escalate_after`},
		{"      escalate_after: 1h\n      escalate_to: treasury\n", `p.yaml:10: rule "r": approval.escalate_to: group "treasury" already decides`},
		{"      escalate_after: 2h\n      escalate_to: leads\n", `p.yaml:9: rule "r": approval.escalate_after (2h0m0s) is not shorter than request_ttl (2h0m0s)`},
		{"      escalate_after: -5m\n      escalate_to: leads\n", `p.yaml:9:`},
	} {
		_, err := evaluation.Parse("p.yaml", []byte(rule(c.approval)))
		require.ErrorContains(t, err, c.want, c.approval)
	}
}
