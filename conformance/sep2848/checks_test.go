package sep2848

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// The checks must be able to fail: each helper is shown a violation.
func TestCheckHelpersSeeViolations(t *testing.T) {
	var body any
	require.NoError(t, json.Unmarshal([]byte(`{"result":{"_meta":{"x":{"binding_token":"t"}}}}`), &body))
	require.Contains(t, findArtifact(body, "$", ""), "binding_token")
	require.NoError(t, json.Unmarshal([]byte(`{"statusMessage":"see eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ4In0.sig"}`), &body))
	require.Contains(t, findArtifact(body, "$", ""), "JWT")
	require.NoError(t, json.Unmarshal([]byte(`{"text":"ask http://127.0.0.1:8480/access/v1/requests/x"}`), &body))
	require.Contains(t, findArtifact(body, "$", "http://127.0.0.1:8480"), "backend's URL")
	require.NoError(t, json.Unmarshal([]byte(`{"taskId":"tsk_1","status":"working"}`), &body))
	require.Empty(t, findArtifact(body, "$", "http://127.0.0.1:8480"))

	ok := map[string]any{MetaAuthorization: map[string]any{"reason": ReasonInsufficientAuthorization, "remediation": "available",
		"remediationHints": []any{map[string]any{"type": "task"}}}}
	require.Empty(t, envelopeIs(ok, RemediationAvailable, true))
	require.NotEmpty(t, envelopeIs(ok, RemediationUnavailable, false))
	require.NotEmpty(t, envelopeIs(map[string]any{}, RemediationAvailable, false))
	noHint := map[string]any{MetaAuthorization: map[string]any{"reason": ReasonInsufficientAuthorization, "remediation": "available"}}
	require.NotEmpty(t, envelopeIs(noHint, RemediationAvailable, true))

	call := Call{Name: "wire_transfer", Arguments: map[string]any{"to": "conf-IGNORE-ALL-RULES"}}
	require.NotEmpty(t, untrusted([]string{"Waiting: transfer to conf-IGNORE-ALL-RULES"}, call))
	require.NotEmpty(t, untrusted([]string{"Waiting\x1b[2J"}, call))
	require.Empty(t, untrusted([]string{"Waiting for approval."}, call))

	require.True(t, saysNotRan.MatchString("The approval was denied; the tool did not run."))
	require.False(t, saysNotRan.MatchString("Approved; the tool ran once."))
	require.True(t, saysRan.MatchString("Approved; the tool ran once."))
	require.True(t, saysMayRun.MatchString("The tool may have run."))

	require.True(t, namesTasks(&rpcError{Code: -32021, Data: json.RawMessage(`{"requiredCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}`)}))
	require.False(t, namesTasks(&rpcError{Code: -32602, Message: "io.modelcontextprotocol/tasks"}))
	require.False(t, namesTasks(&rpcError{Code: -32021, Message: "missing capability"}))
}

func TestFreshReplacesNonce(t *testing.T) {
	c := Call{Name: "t", Arguments: map[string]any{"to": "conf-{nonce}", "n": 1.0, "l": []any{"{nonce}"}}}
	a, b := c.Fresh(), c.Fresh()
	require.NotEqual(t, a.Arguments["to"], b.Arguments["to"])
	require.NotContains(t, a.Arguments["to"], "{nonce}")
	require.Equal(t, 1.0, a.Arguments["n"])
	require.Equal(t, "conf-{nonce}", c.Arguments["to"], "the template is unchanged")
}

func TestDevProfileParses(t *testing.T) {
	p := DevProfile()
	require.Equal(t, "wire_transfer", p.Gated.Name)
	_, err := ParseProfile([]byte(`{"gated":{"name":"x"},"changed":{"name":"x"},"typo":1}`))
	require.Error(t, err, "unknown profile fields are refused")
}

// TestJSONMessages: the artifact scan reads plain JSON, pretty-printed JSON
// and event streams whose data spans several lines; anything else yields
// nothing (and the check fails rather than pass unscanned).
func TestJSONMessages(t *testing.T) {
	require.Len(t, jsonMessages([]byte("{\n  \"a\": 1\n}\n")), 1)
	sse := "event: message\ndata: {\"a\":\ndata: 1}\n\ndata: {\"b\":2}\n\n"
	require.Equal(t, []any{map[string]any{"a": 1.0}, map[string]any{"b": 2.0}}, jsonMessages([]byte(sse)))
	require.Empty(t, jsonMessages([]byte("<html>oops</html>")))
}
