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

const hiddenPolicy = `version: 1
rules:
  - name: refuse_hidden
    match: {resource_id: wire_transfer}
    when: hidden_characters(resource.properties.arguments)
    effect: deny
    reason: hidden_characters
  - name: wire_transfer
    match: {resource_id: wire_transfer}
    effect: allow
  - name: literal
    match: {resource_id: literal}
    when: 'hidden_characters({"a": ["x", "y\u202e"]}) && hidden_characters("\uff41") && !hidden_characters("plain") && !hidden_characters(42)'
    effect: allow
`

// TestHiddenCharactersFunction: a rule can refuse a call whose arguments
// hold a character an approver could not see or could mistake, anywhere:
// in a value, nested in lists and objects, or in an argument's name.
func TestHiddenCharactersFunction(t *testing.T) {
	p, err := evaluation.Parse("p.yaml", []byte(hiddenPolicy))
	require.NoError(t, err)
	keys, err := signing.Open(context.Background(), dbtest.New(t), signing.Options{MasterKey: make([]byte, 32)})
	require.NoError(t, err)
	e, err := evaluation.New(evaluation.Options{Policy: p, Keys: keys, Issuer: issuer, RequestsURL: requestsURL})
	require.NoError(t, err)

	deep := any("clean")
	for i := 0; i < 80; i++ {
		deep = []any{deep}
	}
	cases := []struct {
		name   string
		args   map[string]any
		refuse bool
	}{
		{"plain", map[string]any{"to": "acct-991", "amount": 50000}, false},
		{"accented and other scripts", map[string]any{"to": "Zürich Москва 東京", "memo": "naïve café"}, false},
		{"right-to-left override", map[string]any{"to": "acct-\u202e199\u202c", "amount": 50000}, true},
		{"zero-width space", map[string]any{"to": "acct\u200b-991"}, true},
		{"Cyrillic look-alike in a word", map[string]any{"to": "p\u0430ypal"}, true},
		{"control character", map[string]any{"to": "acct-991\x1b[2K"}, true},
		{"private use", map[string]any{"to": "acct-\ue000"}, true},
		{"no-break space", map[string]any{"to": "acct\u00a0991"}, true},
		{"in an argument name", map[string]any{"t\u200bo": "acct-991"}, true},
		{"nested in a list", map[string]any{"to": []any{"a", map[string]any{"x": "b\u2066"}}}, true},
		{"nested too deeply to check", map[string]any{"to": deep}, true},
		{"fullwidth letters and digits", map[string]any{"to": "\uff43\uff0d\uff11\uff12\uff13"}, true},
		{"one fullwidth digit", map[string]any{"to": "acct-99\uff11"}, true},
		{"superscript", map[string]any{"memo": "10 m\u00b2"}, true},
		{"ligature", map[string]any{"memo": "\ufb01le"}, true},
		{"fullwidth argument name", map[string]any{"\uff54o": "acct-991"}, true},
		{"decomposed accents and kana", map[string]any{"to": "Zu\u0308rich", "memo": "\u30ab\u3099 東京タワー、"}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := e.Evaluate(context.Background(), "cli_test", call("wire_transfer", c.args))
			require.NoError(t, err)
			if c.refuse {
				require.False(t, out.Decision.Decision)
				require.Equal(t, "refuse_hidden", out.Rule)
				require.Equal(t, "hidden_characters", out.Decision.Context.Str(authzen.CtxReason))
				require.NotContains(t, out.Decision.Context, authzen.CtxAccessRequest, "refused outright: not requestable")
			} else {
				require.True(t, out.Decision.Decision, "%+v", out)
			}
		})
	}
	out, err := e.Evaluate(context.Background(), "cli_test", call("literal", nil))
	require.NoError(t, err)
	require.True(t, out.Decision.Decision, "CEL literals and scalars: %+v", out)
}

// TestDeclaredContext: a request rule's declared context is what its
// request_schema gives context and what it binds; nothing else.
func TestDeclaredContext(t *testing.T) {
	p, err := evaluation.Parse("p.yaml", []byte(`version: 1
rules:
  - name: asks
    match: {resource_id: a}
    effect: request
    context_members: [tenant]
    approval: {kinds: [itsm]}
    request_schema:
      type: object
      properties:
        context:
          type: object
          required: [ticket, urgency]
          properties:
            ticket: {type: string}
            justification: {type: string}
  - name: asks_nothing
    match: {resource_id: b}
    effect: request
    approval: {kinds: [itsm]}
`))
	require.NoError(t, err)
	r, _ := p.Rule("asks")
	require.Equal(t, []string{"justification", "tenant", "ticket", "urgency"}, r.Approval.DeclaredContext)
	r, _ = p.Rule("asks_nothing")
	require.Empty(t, r.Approval.DeclaredContext)
}
