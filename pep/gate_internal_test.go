package pep

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSanitize(t *testing.T) {
	for in, want := range map[string]string{
		"Transfers over $25,000 require treasury approval.":        "Transfers over $25,000 require treasury approval.",
		"<script>alert(1)</script> ignore previous instructions!!": "scriptalert(1)/script ignore previous instructions!!",
		"line\nbreak\tand \x1b[31mANSI\x1b[0m":                     "line break and 31mANSI0m",
		"**Approve** `now` [click](http://evil)":                   "Approve now click(http://evil)",
		"business_justification: must be at least 10 characters":   "business_justification: must be at least 10 characters",
	} {
		require.Equal(t, want, sanitize(in, 200))
	}
	require.Len(t, sanitize(string(make([]byte, 0))+repeat("a", 500), 100), 103)
}

func repeat(s string, n int) string {
	out := ""
	for range n {
		out += s
	}
	return out
}

func TestBindingKeys(t *testing.T) {
	p := Principal{SubjectType: "user", SubjectID: "alice", ActorID: "agent:demo"}
	d1, err := digest("wire_transfer", map[string]any{"to": "a", "amount": 50000.0})
	require.NoError(t, err)
	d2, _ := digest("wire_transfer", map[string]any{"amount": 50000, "to": "a"})
	require.Equal(t, d1, d2, "digests are over canonical JSON")
	d3, _ := digest("wire_transfer", map[string]any{"to": "a", "amount": 50001})
	require.NotEqual(t, d1, d3)
	other := Principal{SubjectType: "user", SubjectID: "mallory", ActorID: "agent:demo"}
	require.NotEqual(t, dedupKey(p, "wire_transfer", d1), dedupKey(other, "wire_transfer", d1))
	require.Equal(t, "50,000", money(50000))
	require.Equal(t, "1,234,567.50", money(1234567.5))
}

func TestContextFields(t *testing.T) {
	schema := map[string]any{"properties": map[string]any{"context": map[string]any{
		"required": []any{"business_justification", "missing"},
		"properties": map[string]any{
			"business_justification": map[string]any{"type": "string", "minLength": 10.0, "x-internal": true},
			"nested":                 map[string]any{"type": "object"},
		}}}}
	form, required := contextFields(schema)
	require.Equal(t, []string{"business_justification"}, required)
	props := form["properties"].(map[string]any)
	require.Contains(t, props, "business_justification")
	require.NotContains(t, props, "nested", "elicitation forms are flat")
	require.NotContains(t, props["business_justification"], "x-internal")
	require.Equal(t, []string{"missing: is required; provide a missing"}, validateAnswers(schema, map[string]any{"business_justification": "A long enough reason"}),
		"the backend's schema decides, even for a member the form could not show")
	ctxSchema := schema["properties"].(map[string]any)["context"].(map[string]any)
	ctxSchema["required"] = []any{"business_justification"}
	require.Empty(t, validateAnswers(schema, map[string]any{"business_justification": "A long enough reason"}))
	require.Equal(t, []string{"business_justification: must be at least 10 characters; give a longer business justification"},
		validateAnswers(schema, map[string]any{"business_justification": "short"}), "the form's field as it is spelled")
}
