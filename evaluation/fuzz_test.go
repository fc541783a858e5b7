package evaluation_test

import (
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/evaluation"
)

// FuzzEvaluationRequest decodes evaluation and batch bodies as the PDP's
// handlers do and validates them against the AuthZEN schema: nothing
// panics, and a request that validates still validates, unchanged, after
// a round trip through its wire form.
func FuzzEvaluationRequest(f *testing.F) {
	for _, s := range []string{
		`{"subject":{"type":"user","id":"alice","properties":{"act":{"sub":"agent:demo"}}},"action":{"name":"tools/call"},"resource":{"type":"mcp_tool","id":"wire_transfer","properties":{"arguments":{"to":"acct-991","amount":50000}}}}`,
		`{"subject":{"type":"user"},"action":{},"resource":{"type":"x","id":""}}`, `{"subject":null}`, `{}`, `[]`,
		`{"subject":{"type":"user","id":"a"},"action":{"name":"r"},"resource":{"type":"t","id":"i"},"context":{"time":"2026-01-01T00:00:00Z"}}`,
		`{"evaluations":[{"resource":{"type":"t","id":"1"}},{"resource":{"type":"t","id":"2"}}],"subject":{"type":"user","id":"a"},"action":{"name":"r"},"options":{"evaluations_semantic":"deny_on_first_deny"}}`,
		`{"evaluations":[],"options":{"evaluations_semantic":"bogus"}}`, `{"subject":{"type":1,"id":[]}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var one authzen.EvaluationRequest
		if json.Unmarshal(body, &one) == nil && len(evaluation.ValidateRequest(one)) == 0 {
			var back authzen.EvaluationRequest
			roundTrip(t, one, &back)
			require.Empty(t, evaluation.ValidateRequest(back))
		}
		var batch authzen.EvaluationsRequest
		if json.Unmarshal(body, &batch) == nil && len(evaluation.ValidateBatch(batch)) == 0 {
			require.NotEmpty(t, evaluation.Items(batch), "a valid batch has at least one item")
			var back authzen.EvaluationsRequest
			roundTrip(t, batch, &back)
			require.Empty(t, evaluation.ValidateBatch(back))
		}
	})
}

// roundTrip encodes v, decodes it into back, and checks the encoding is
// stable.
func roundTrip(t *testing.T, v, back any) {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, back))
	b2, err := json.Marshal(back)
	require.NoError(t, err)
	require.JSONEq(t, string(b), string(b2))
}

var ruleName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)

// FuzzPolicy loads arbitrary policy documents: nothing panics; a refused
// one is a *evaluation.Error listing at least one problem, each with a
// message; an accepted one has uniquely, validly named rules and loads the
// same way twice.
func FuzzPolicy(f *testing.F) {
	for _, file := range []string{"testdata/policy.yaml", "../requests/testdata/policy.yaml", "../requests/testdata/resolution.yaml"} {
		b, err := os.ReadFile(file)
		require.NoError(f, err)
		f.Add(b)
	}
	for _, s := range []string{"version: 1\nrules: []\n", "version: 2\n", "", "rules:\n  - name: x\n    effect: allow\n    when: 'a +'\n",
		"version: 1\nrules:\n  - {name: a, effect: allow, match: {action: x}}\n  - {name: a, effect: deny}\n",
		"version: 1\nwindows:\n  change: {timezone: Nowhere/City, days: [mon], from: '25:00', to: '01:00'}\n",
		"version: 1\nrules:\n  - {name: r, effect: request, approval: {quorum: -1}}\n", "&a [*a, *a]", "version: 1\nunknown: 1\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		p, err := evaluation.Parse("fuzz.yaml", doc)
		if err != nil {
			var perr *evaluation.Error
			require.True(t, errors.As(err, &perr), "refusal is a typed error: %v", err)
			require.NotEmpty(t, perr.Problems)
			for _, pr := range perr.Problems {
				require.NotEmpty(t, pr.Message)
			}
			return
		}
		seen := map[string]bool{}
		for _, r := range p.Rules {
			require.Regexp(t, ruleName, r.Name)
			require.False(t, seen[r.Name], "rule %q twice", r.Name)
			seen[r.Name] = true
			got, ok := p.Rule(r.Name)
			require.True(t, ok)
			require.Same(t, r, got)
		}
		again, err := evaluation.Parse("fuzz.yaml", doc)
		require.NoError(t, err)
		require.Len(t, again.Rules, len(p.Rules))
		for i := range p.Rules {
			require.Equal(t, p.Rules[i].Name, again.Rules[i].Name)
		}
	})
}
