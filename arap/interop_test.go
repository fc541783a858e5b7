package arap_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dev"
)

// interopCases is the AuthZEN working group's Todo case file.
type interopCases struct {
	Evaluation []struct {
		Request  json.RawMessage `json:"request"`
		Expected json.RawMessage `json:"expected"`
	} `json:"evaluation"`
	Evaluations []struct {
		Request  json.RawMessage `json:"request"`
		Expected json.RawMessage `json:"expected"`
	} `json:"evaluations"`
}

// TestAuthZENInteropTodo runs the working group's 40 single and 3 batch
// Todo cases (vendored in testdata) against the Todo example policy through
// the HTTP endpoints, and compares as the group's harness (runner.ts) does:
// JSON.stringify(expected) === JSON.stringify(data.decision || false) for a
// single evaluation, and === JSON.stringify(data.evaluations) for a batch,
// so a batch item with any member beyond decision fails.
func TestAuthZENInteropTodo(t *testing.T) {
	policy, err := filepath.Abs("../docs/examples/todo/policy.yaml")
	require.NoError(t, err)
	env := backendtest.Start(t, backendtest.Options{PolicyFile: policy})
	pep := api{t: t, base: env.URL, token: dev.PEPToken}
	raw, err := os.ReadFile("testdata/authzen-interop/decisions-authorization-api-1_0-02.json")
	require.NoError(t, err)
	var cases interopCases
	require.NoError(t, json.Unmarshal(raw, &cases))
	require.Len(t, cases.Evaluation, 40)
	require.Len(t, cases.Evaluations, 3)

	stringify := func(v json.RawMessage) string {
		var b bytes.Buffer
		require.NoError(t, json.Compact(&b, v))
		return b.String()
	}
	for i, c := range cases.Evaluation {
		r := pep.do("POST", "/access/v1/evaluation", []byte(c.Request))
		require.Equal(t, 200, r.status, "case %d: %s", i, r.body)
		var data struct {
			Decision json.RawMessage `json:"decision"`
		}
		require.NoError(t, json.Unmarshal(r.body, &data))
		got := data.Decision
		if got == nil || string(got) == "false" {
			got = json.RawMessage("false") // data.decision || false
		}
		require.Equal(t, stringify(c.Expected), stringify(got), "evaluation case %d: %s", i, c.Request)
	}
	for i, c := range cases.Evaluations {
		r := pep.do("POST", "/access/v1/evaluations", []byte(c.Request))
		require.Equal(t, 200, r.status, "batch case %d: %s", i, r.body)
		var data struct {
			Evaluations json.RawMessage `json:"evaluations"`
		}
		require.NoError(t, json.Unmarshal(r.body, &data))
		require.Equal(t, stringify(c.Expected), stringify(data.Evaluations), fmt.Sprintf("batch case %d: %s", i, c.Request))
	}
	// The cases' subjects are all in the directory; an identity it does not
	// list is denied everything, as is a listed one under another type.
	for _, subject := range []map[string]any{{"type": "user", "id": "squanchy@the-citadel.com"}, {"type": "agent", "id": "rick@the-citadel.com"}} {
		for _, action := range []string{"can_read_user", "can_read_todos", "can_create_todo", "can_update_todo", "can_delete_todo"} {
			r := pep.do("POST", "/access/v1/evaluation", map[string]any{"subject": subject, "action": map[string]any{"name": action},
				"resource": map[string]any{"type": "todo", "id": "1", "properties": map[string]any{"ownerID": subject["id"]}}})
			require.Equal(t, 200, r.status, "%s", r.body)
			require.Equal(t, false, r.json(t)["decision"], "%v %s", subject, action)
		}
	}
}

// TestDirectorySubjectAttributesOverHTTP: the backend registers the
// directory as the subject attribute source "directory"; a policy reads a
// subject's groups from it.
func TestDirectorySubjectAttributesOverHTTP(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{Policy: []byte(`version: 1
subject_attributes: {source: directory}
definitions:
  treasurer: "'treasury' in subject_attributes.?groups.orValue([])"
rules:
  - name: ledger
    match: {actions: [read_ledger, export_ledger]}
    when: treasurer
    effect: allow
`)})
	pep := api{t: t, base: env.URL, token: dev.PEPToken}
	ask := func(who, action string) map[string]any {
		return map[string]any{"subject": map[string]any{"type": "user", "id": who}, "action": map[string]any{"name": action},
			"resource": map[string]any{"type": "ledger", "id": "main"}}
	}
	for _, tc := range []struct {
		who, action string
		allow       bool
	}{{"bob", "read_ledger", true}, {"carol", "export_ledger", true}, {"alice", "read_ledger", false}, {"bob", "delete_ledger", false}, {"nobody", "read_ledger", false}} {
		r := pep.do("POST", "/access/v1/evaluation", ask(tc.who, tc.action))
		require.Equal(t, 200, r.status, "%s", r.body)
		require.Equal(t, tc.allow, r.json(t)["decision"], "%s %s", tc.who, tc.action)
	}
	r := pep.do("POST", "/access/v1/evaluations", map[string]any{"evaluations": []any{ask("bob", "read_ledger"), ask("alice", "read_ledger")}})
	require.Equal(t, 200, r.status, "%s", r.body)
	require.JSONEq(t, `{"evaluations":[{"decision":true},{"decision":false}]}`, string(r.body))
}
