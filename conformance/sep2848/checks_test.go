package sep2848

import (
	"encoding/json"
	"testing"
	"time"

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

	require.Equal(t, "", bodyAgrees(ApprovedExecuted, "Approved; the tool ran once."))
	require.NotEmpty(t, bodyAgrees(ApprovedExecuted, "Not approved; the tool did not run."))
	require.NotEmpty(t, bodyAgrees(DeniedNotExecuted, "Approved; the tool ran once."))
	require.Equal(t, "", bodyAgrees(ExecutionError, "The tool ran after approval but failed."))
	require.NotEmpty(t, bodyAgrees(ExecutionError, "Something went wrong."), "an execution error must say the tool ran")
	require.NotEmpty(t, bodyAgrees(ExecutionError, "The tool did not run."))
	require.Equal(t, "", bodyAgrees(OutcomeUnknown, "The tool may have run."))
	require.NotEmpty(t, bodyAgrees(OutcomeUnknown, "The tool ran."))

	require.True(t, namesTasks(&rpcError{Code: -32021, Data: json.RawMessage(`{"requiredCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}`)}))
	require.False(t, namesTasks(&rpcError{Code: -32602, Message: "io.modelcontextprotocol/tasks"}))
	require.False(t, namesTasks(&rpcError{Code: -32021, Message: "missing capability"}))
}

// TestPresentsDone: "working task shown as done" sees a completion claim
// wherever it stands, and only negation or condition before the completion
// word, in the same sentence, takes the claim back.
func TestPresentsDone(t *testing.T) {
	for _, s := range []string{
		"Transfer completed.",
		"Waiting for approval. Transfer completed.",
		"Note: the transfer was executed",
		"Approved; the tool ran once.",
		"Not yet? Done.",
	} {
		require.NotEmpty(t, presentsDone(s), "%q presents the action as done", s)
	}
	for _, s := range []string{
		"This action is waiting for an out-of-band approval and has not run.",
		"Waiting for approval: Transfers over $25,000 require approval by a member of treasury.",
		"Once approved, the transfer will be completed.",
		"The transfer is pending; nothing was transferred yet.",
		"No transfer has been executed.",
	} {
		require.Empty(t, presentsDone(s), "%q does not present the action as done", s)
	}
}

// TestGuessable: counters, clocks and short ids are refused; random ones
// pass.
func TestGuessable(t *testing.T) {
	require.NotEmpty(t, guessable([]string{"tsk_0000000000000001", "tsk_0000000000000002", "tsk_0000000000000003"}))
	require.NotEmpty(t, guessable([]string{"tsk_1758800000000000123", "tsk_1758800000000000456"}), "a clock in nanoseconds")
	require.NotEmpty(t, guessable([]string{"a1b2c3", "d4e5f6"}), "too short")
	require.Empty(t, guessable([]string{"tsk_7MZQ2XKD4TJW6N3HBV5RGC8YPA", "tsk_Q4W9ZK2M7XJD5HT3RC6VNB8PGY", "tsk_2KD7QX9MZ4JW6TH3NB5VRC8GYP"}))
	require.Empty(t, guessable([]string{"786512e2-9e0d-44bd-8f29-789f320fe840", "0b6c3f1a-52d7-4e8b-a1f0-3c9d2e7b6a41"}))
}

// TestLeaksAndGuidance: the approver's identity is found as a word, not
// inside another; degraded guidance needs all three parts.
func TestLeaksAndGuidance(t *testing.T) {
	bodies := [][]byte{[]byte(`{"statusMessage":"Approved by client:itsm."}`)}
	require.NotEmpty(t, leaks(bodies, []string{"client:itsm"}))
	require.NotEmpty(t, leaks(bodies, []string{"itsm"}))
	require.Empty(t, leaks([][]byte{[]byte(`{"text":"itsmith"}`)}, []string{"itsm"}))
	require.Empty(t, leaks(bodies, []string{"bob"}), "identities shorter than four characters are not looked for")

	require.Empty(t, guidance("This call needs an approval and did not run. Retry from a client that supports tasks."))
	require.NotEmpty(t, guidance("This call needs an approval. Retry from a client that supports tasks."), "does not say it did not run")
	require.NotEmpty(t, guidance("Denied; the tool did not run."), "no approval, no next step")
	require.NotEmpty(t, guidance("This call needs an approval and did not run."), "no next step")
}

// TestNotRequestable: a limit's answer must be a denial no agent would
// retry as a request.
func TestNotRequestable(t *testing.T) {
	ok := &response{result: map[string]any{"isError": true, "_meta": map[string]any{MetaAuthorization: map[string]any{"remediation": "unavailable"}}}}
	require.Empty(t, notRequestable(ok))
	require.NotEmpty(t, notRequestable(&response{result: map[string]any{"resultType": "task", "taskId": "t"}}))
	require.NotEmpty(t, notRequestable(&response{result: map[string]any{"isError": false}}))
	require.NotEmpty(t, notRequestable(&response{result: map[string]any{"resultType": "input_required"}}))
	require.NotEmpty(t, notRequestable(&response{result: map[string]any{"isError": true, "_meta": map[string]any{MetaAuthorization: map[string]any{"remediation": "available"}}}}))
	require.NotEmpty(t, notRequestable(&response{err: &rpcError{Code: -32603}}))
}

// TestTranscriptScans: authorizationContextId anywhere, and results whose
// body contradicts their disposition, are found.
func TestTranscriptScans(t *testing.T) {
	var v any
	require.NoError(t, json.Unmarshal([]byte(`{"result":{"_meta":{"io.modelcontextprotocol/authorization":{"authorizationContextId":"x"}}}}`), &v))
	require.NotEmpty(t, findMember(v, "$", "authorizationContextId"))
	require.NoError(t, json.Unmarshal([]byte(`{"result":{"status":"completed","result":{"content":[{"type":"text","text":"The tool did not run."}],
		"_meta":{"io.modelcontextprotocol/tool-approval-disposition":"approved-executed"}}}}`), &v))
	var seen []string
	dispositions(v, func(d, text string, _ map[string]any) { seen = append(seen, bodyAgrees(d, text)) })
	require.Len(t, seen, 1)
	require.NotEmpty(t, seen[0])
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
	require.Equal(t, 30, p.Limits.SubmissionsPerMinute)
	_, err := ParseProfile([]byte(`{"gated":{"name":"x"},"changed":{"name":"x"},"typo":1}`))
	require.Error(t, err, "unknown profile fields are refused")
	_, err = ParseProfile([]byte(`{"gated":{"name":"x"},"changed":{"name":"x"},"outliving":{"name":"x","after":"3s"}}`))
	require.ErrorContains(t, err, "max_requests")
	d, err := ParseProfile([]byte(`{"gated":{"name":"x"},"changed":{"name":"x"},"provisioning":{"name":"p","arguments":{"to":"{nonce}"},"after":"3s"},
		"stalling":{"name":"s","for":"10s","effects":1}}`))
	require.NoError(t, err)
	require.Equal(t, Duration(3*time.Second), d.Provisioning.After)
	require.Equal(t, "p", d.Provisioning.Fresh().Name)
	require.Equal(t, 1, *d.Stalling.Effects)
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

// TestRunScans: the run-wide scans find a completed task without a
// disposition, an envelope that contradicts the disposition, a task's text
// that repeats its call's arguments, and a request of the server's own.
func TestRunScans(t *testing.T) {
	var v any
	require.NoError(t, json.Unmarshal([]byte(`{"result":{"taskId":"t1","status":"completed","result":{"content":[{"type":"text","text":"Done."}],"_meta":{}}}}`), &v))
	var missing []string
	completedResults(v, func(id string, res map[string]any) { missing = append(missing, missingDisposition(id, res)) })
	require.Len(t, missing, 1)
	require.Contains(t, missing[0], "t1")
	require.NoError(t, json.Unmarshal([]byte(`{"result":{"taskId":"t2","status":"completed","result":{"content":[],
		"_meta":{"io.modelcontextprotocol/tool-approval-disposition":"approved-executed"}}}}`), &v))
	missing = nil
	completedResults(v, func(id string, res map[string]any) { missing = append(missing, missingDisposition(id, res)) })
	require.Equal(t, []string{""}, missing)
	require.NoError(t, json.Unmarshal([]byte(`{"result":{"taskId":"t3","status":"working"}}`), &v))
	completedResults(v, func(string, map[string]any) { t.Fatal("a working task is not completed") })

	unavailable := map[string]any{MetaAuthorization: map[string]any{"reason": ReasonInsufficientAuthorization, "remediation": "unavailable"}}
	available := map[string]any{MetaAuthorization: map[string]any{"reason": ReasonInsufficientAuthorization, "remediation": "available"}}
	require.Empty(t, envelopeAgrees(DeniedNotExecuted, unavailable, true))
	require.NotEmpty(t, envelopeAgrees(DeniedNotExecuted, available, true), "a denial invites a retry")
	require.NotEmpty(t, envelopeAgrees(DeniedNotExecuted, map[string]any{}, true), "a SEP-2643 server's denial without its envelope")
	require.Empty(t, envelopeAgrees(DeniedNotExecuted, map[string]any{}, false), "a server without SEP-2643")
	require.NotEmpty(t, envelopeAgrees(ExecutionError, unavailable, true))
	require.NotEmpty(t, envelopeAgrees(ApprovedExecuted, unavailable, false))
	require.Empty(t, envelopeAgrees(OutcomeUnknown, map[string]any{}, true))

	require.NoError(t, json.Unmarshal([]byte(`{"result":{"taskId":"t4","status":"input_required","statusMessage":"Need a ticket for conf-abc123.",
		"_meta":{"io.modelcontextprotocol/model-immediate-response":"ok"}}}`), &v))
	call := Call{Name: "wire_transfer", Arguments: map[string]any{"to": "conf-abc123"}}
	var tainted []string
	modelTexts(v, func(id string, texts []string) { tainted = append(tainted, id+": "+untrusted(texts, call)) })
	require.Len(t, tainted, 1)
	require.Contains(t, tainted[0], "repeats the client-supplied argument")

	require.Empty(t, serverRequest([]byte(`{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required"}}`)))
	require.NotEmpty(t, serverRequest([]byte("event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"elicitation/create\",\"params\":{}}\n\n"+
		"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n")))
	require.Empty(t, serverRequest([]byte("data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n")), "a notification is no request")

	require.Empty(t, requestableGuidance("This call needs an approval. Retry from a client that supports tasks."))
	require.NotEmpty(t, requestableGuidance("Denied."), "no approval, no next step")
	require.NotEmpty(t, requestableGuidance("This call needs an approval."), "no next step")
}
