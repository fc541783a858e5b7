package evaluation_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/signing"
)

// countingSource is a SubjectSource over a map that counts its lookups.
type countingSource struct {
	people  map[string]map[string]any
	lookups atomic.Int64
	err     error
}

func (s *countingSource) SubjectAttributes(_ context.Context, _, id string) (map[string]any, error) {
	s.lookups.Add(1)
	if s.err != nil {
		return nil, s.err
	}
	return s.people[id], nil
}

func engineWith(t *testing.T, doc string, sources map[string]evaluation.SubjectSource) *evaluation.Engine {
	t.Helper()
	p, err := evaluation.Parse("p.yaml", []byte(doc))
	require.NoError(t, err)
	keys, err := signing.Open(context.Background(), dbtest.New(t), signing.Options{MasterKey: make([]byte, 32)})
	require.NoError(t, err)
	e, err := evaluation.New(evaluation.Options{Policy: p, Keys: keys, Issuer: issuer, RequestsURL: requestsURL,
		SubjectSources: sources, Now: func() time.Time { return fixed }})
	require.NoError(t, err)
	return e
}

func ask(subjectType, subject, action string, resource authzen.Object) authzen.EvaluationRequest {
	if resource == nil {
		resource = authzen.Object{"type": "doc", "id": "1"}
	}
	return authzen.EvaluationRequest{
		Subject: authzen.Object{"type": subjectType, "id": subject}, Action: authzen.Object{"name": action}, Resource: resource,
	}
}

const peoplePolicy = `version: 1
subject_attributes: {source: people}
definitions:
  roles: "subject_attributes.?roles.orValue([])"
  is_editor: "'editor' in roles"
  owns: "resource.?properties.?owner.orValue('') == subject_attributes.?id.orValue('-')"
rules:
  - name: readers
    match: {actions: [read, list]}
    when: "'id' in subject_attributes"
    effect: allow
  - name: editors
    match: {actions: [update, delete]}
    when: is_editor && owns
    effect: allow
  - name: admins
    match: {action: update}
    when: "'admin' in roles"
    effect: allow
  - name: everyone_pings
    match: {action: ping}
    effect: allow
`

func people() *countingSource {
	return &countingSource{people: map[string]map[string]any{
		"u-1":   {"id": "ed@example.com", "roles": []any{"editor"}},
		"u-2":   {"id": "ada@example.com", "roles": []any{"admin"}},
		"u-3":   {"id": "vic@example.com", "roles": []any{"viewer"}},
		"Mixed": {"id": "mixed@example.com", "roles": []any{"admin"}},
	}}
}

// TestSubjectAttributesDefinitionsAndActions: subject attributes come from
// the source by the subject's identity, definitions read them and each
// other, and one rule covers several actions (and no others).
func TestSubjectAttributesDefinitionsAndActions(t *testing.T) {
	src := people()
	e := engineWith(t, peoplePolicy, map[string]evaluation.SubjectSource{"people": src})
	ctx := context.Background()
	mine := authzen.Object{"type": "doc", "id": "1", "properties": map[string]any{"owner": "ed@example.com"}}
	theirs := authzen.Object{"type": "doc", "id": "2", "properties": map[string]any{"owner": "vic@example.com"}}
	cases := []struct {
		name  string
		req   authzen.EvaluationRequest
		allow bool
		rule  string
	}{
		{"a known user reads", ask("user", "u-3", "read", nil), true, "readers"},
		{"the same rule covers list", ask("user", "u-3", "list", nil), true, "readers"},
		{"an unknown identity reads nothing", ask("user", "u-404", "read", nil), false, ""},
		{"an editor updates their own", ask("user", "u-1", "update", mine), true, "editors"},
		{"and deletes their own", ask("user", "u-1", "delete", mine), true, "editors"},
		{"not someone else's", ask("user", "u-1", "update", theirs), false, ""},
		{"a viewer updates nothing", ask("user", "u-3", "update", mine), false, ""},
		{"an admin updates (a later rule)", ask("user", "u-2", "update", theirs), true, "admins"},
		{"the admin rule covers update only", ask("user", "u-2", "delete", theirs), false, ""},
		{"an action no rule lists", ask("user", "u-2", "destroy", nil), false, ""},
		// Identities are compared as the source compares them: exactly here,
		// and never with a type prefix read off.
		{"a type-prefixed id is another identity", ask("user", "user:u-3", "read", nil), false, ""},
		{"case is part of an opaque id", ask("user", "mixed", "read", nil), false, ""},
		{"another subject type has no attributes", ask("agent", "u-3", "read", nil), false, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := e.Evaluate(ctx, "pep", tc.req)
			require.NoError(t, err)
			require.Equal(t, tc.allow, out.Decision.Decision)
			require.Equal(t, tc.rule, out.Rule)
			if !tc.allow {
				require.Equal(t, authzen.ReasonNoMatchingRule, out.Decision.Context.Str(authzen.CtxReason), "a missing attribute is no attribute, not an error")
			}
		})
	}
}

// TestSubjectLookupOncePerEvaluation: the lookup happens only when a
// condition reads subject_attributes, at most once per evaluation however
// many rules and definitions read it, once per subject in a batch, and a
// failing lookup denies.
func TestSubjectLookupOncePerEvaluation(t *testing.T) {
	src := people()
	e := engineWith(t, peoplePolicy, map[string]evaluation.SubjectSource{"people": src})
	ctx := context.Background()

	// ping matches a rule without a condition: no lookup at all.
	out, err := e.Evaluate(ctx, "pep", ask("user", "u-1", "ping", nil))
	require.NoError(t, err)
	require.True(t, out.Decision.Decision)
	require.EqualValues(t, 0, src.lookups.Load())

	// update by a viewer: editors (roles, is_editor, owns) and admins
	// (roles) all read it, and all are tried.
	out, err = e.Evaluate(ctx, "pep", ask("user", "u-3", "update", nil))
	require.NoError(t, err)
	require.False(t, out.Decision.Decision)
	require.EqualValues(t, 1, src.lookups.Load())

	// A batch of three items about one subject and one about another: two.
	src.lookups.Store(0)
	outs, err := e.EvaluateBatch(ctx, "pep", authzen.EvaluationsRequest{
		Subject: authzen.Object{"type": "user", "id": "u-2"}, Action: authzen.Object{"name": "update"},
		Evaluations: []authzen.EvaluationRequest{
			{Resource: authzen.Object{"type": "doc", "id": "1"}},
			{Resource: authzen.Object{"type": "doc", "id": "2"}},
			{Resource: authzen.Object{"type": "doc", "id": "3"}},
			{Subject: authzen.Object{"type": "user", "id": "u-3"}, Resource: authzen.Object{"type": "doc", "id": "4"}},
		},
	})
	require.NoError(t, err)
	require.Len(t, outs, 4)
	require.EqualValues(t, 2, src.lookups.Load())

	// Across evaluations nothing is cached: a change in the source counts
	// at the next evaluation.
	src.people["u-3"]["roles"] = []any{"admin"}
	out, err = e.Evaluate(ctx, "pep", ask("user", "u-3", "update", nil))
	require.NoError(t, err)
	require.True(t, out.Decision.Decision)

	// A failing source fails closed.
	src.err = errors.New("directory unavailable")
	out, err = e.Evaluate(ctx, "pep", ask("user", "u-2", "update", nil))
	require.NoError(t, err)
	require.False(t, out.Decision.Decision)
	require.Equal(t, authzen.ReasonPolicyError, out.Decision.Context.Str(authzen.CtxReason))
}

// TestBatchItemShape: in a batch, plain decisions are {decision} alone; a
// requestable denial keeps the context ARAP needs.
func TestBatchItemShape(t *testing.T) {
	e, _ := setup(t)
	outs, err := e.EvaluateBatch(context.Background(), "pep", authzen.EvaluationsRequest{Evaluations: []authzen.EvaluationRequest{
		call("get_balance", map[string]any{}),
		call("wire_transfer", map[string]any{"to": "a", "amount": 2000000}),
		call("wire_transfer", map[string]any{"to": "a", "amount": 50000}),
	}})
	require.NoError(t, err)
	require.Equal(t, authzen.Decision{Decision: true}, outs[0].BatchItem())
	require.Equal(t, authzen.Decision{Decision: false}, outs[1].BatchItem())
	item := outs[2].BatchItem()
	require.False(t, item.Decision)
	for _, k := range []string{authzen.CtxAccessRequest, authzen.CtxEvaluationID, authzen.CtxEvaluatedAt, authzen.CtxReason} {
		require.Contains(t, item.Context, k)
	}
	// The single endpoint's decision keeps its diagnostics.
	require.NotEmpty(t, outs[1].Decision.Context.Str(authzen.CtxReason))
}

func TestPolicyFeatureErrorsHaveLines(t *testing.T) {
	cases := []struct {
		name, doc string
		want      []string
	}{
		{"a cycle", `version: 1
definitions:
  a: "b && true"
  b: "c || false"
  c: "a"
rules:
  - {name: r, when: a, effect: allow}
`, []string{`p.yaml:3: definition "a": definitions read each other in a cycle (a -> b -> c -> a)`}},
		{"reading itself", `version: 1
definitions:
  self: "self"
rules:
  - {name: r, when: self, effect: allow}
`, []string{`p.yaml:3: definition "self": definitions read each other in a cycle (self -> self)`}},
		{"a built-in name", `version: 1
definitions:
  subject: "true"
rules:
  - {name: r, when: "true", effect: allow}
`, []string{`p.yaml:3: definition "subject": the name is taken`}},
		{"a bad expression", `version: 1
definitions:
  good: "true"
  bad: "resource.id =="
rules:
  - {name: r, when: good, effect: allow}
`, []string{`p.yaml:4: definition "bad":`}},
		{"an unknown name", `version: 1
definitions:
  d: "nobody.here"
rules:
  - {name: r, when: d, effect: allow}
`, []string{`p.yaml:3: definition "d":`, "undeclared reference to 'nobody'"}},
		{"a condition reading an undefined definition", `version: 1
rules:
  - {name: r, when: undefined_thing, effect: allow}
`, []string{`p.yaml:3: rule "r": when:`, "undeclared reference to 'undefined_thing'"}},
		{"subject_attributes without a source", `version: 1
rules:
  - {name: r, when: "'id' in subject_attributes", effect: allow}
`, []string{`p.yaml:3: rule "r": when:`, "undeclared reference to 'subject_attributes'"}},
		{"action and actions", `version: 1
rules:
  - {name: r, match: {action: a, actions: [b]}, effect: allow}
`, []string{`p.yaml:3: rule "r": match: give action or actions, not both`}},
		{"no actions", `version: 1
rules:
  - {name: r, match: {actions: []}, effect: allow}
`, []string{`p.yaml:3: rule "r": match.actions is empty`}},
		{"source and file", `version: 1
subject_attributes: {source: directory, file: x.json}
rules:
  - {name: r, when: "true", effect: allow}
`, []string{`p.yaml:2: subject_attributes needs exactly one of source`}},
		{"a missing file", `version: 1
subject_attributes: {file: does-not-exist.json}
rules:
  - {name: r, when: "true", effect: allow}
`, []string{`p.yaml:2: subject_attributes.file:`, "does-not-exist.json"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := evaluation.Parse("p.yaml", []byte(tc.doc))
			var perr *evaluation.Error
			require.ErrorAs(t, err, &perr)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
}

// TestSubjectSourceMustExist: a policy naming a source the deployment does
// not have is refused at start and at reload (the running policy stays).
func TestSubjectSourceMustExist(t *testing.T) {
	p, err := evaluation.Parse("p.yaml", []byte(peoplePolicy))
	require.NoError(t, err)
	keys, err := signing.Open(context.Background(), dbtest.New(t), signing.Options{MasterKey: make([]byte, 32)})
	require.NoError(t, err)
	_, err = evaluation.New(evaluation.Options{Policy: p, Keys: keys, Issuer: issuer, RequestsURL: requestsURL})
	require.ErrorContains(t, err, `subject_attributes.source "people" is not a source of this deployment`)

	dir := t.TempDir()
	file := filepath.Join(dir, "policy.yaml")
	require.NoError(t, os.WriteFile(file, []byte("version: 1\nrules:\n  - {name: r, match: {action: ping}, effect: allow}\n"), 0o600))
	e, err := evaluation.New(evaluation.Options{PolicyFile: file, Keys: keys, Issuer: issuer, RequestsURL: requestsURL})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(file, []byte(peoplePolicy), 0o600))
	require.ErrorContains(t, e.Reload(), "is not a source of this deployment")
	require.Len(t, e.Policy().Rules, 1)
}

// TestSubjectFile: a file source's ids are canonical and opaque.
func TestSubjectFile(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		f := filepath.Join(dir, "people.json")
		require.NoError(t, os.WriteFile(f, []byte(s), 0o600))
		return f
	}
	f, err := evaluation.LoadSubjectFile(write(`{"Rick@x.test": {"roles": ["admin"]}, "b64/Ab==": {"roles": []}}`))
	require.NoError(t, err)
	got, err := f.SubjectAttributes(context.Background(), "user", "Rick@x.test")
	require.NoError(t, err)
	require.Equal(t, []any{"admin"}, got["roles"])
	for _, other := range []string{"rick@x.test", "user:Rick@x.test", "b64/AB=="} {
		got, err = f.SubjectAttributes(context.Background(), "user", other)
		require.NoError(t, err)
		require.Nil(t, got, other)
	}
	_, err = evaluation.LoadSubjectFile(write(`{" rick": {}}`))
	require.ErrorContains(t, err, "whitespace")
	_, err = evaluation.LoadSubjectFile(write(`{"rick": ["admin"]}`))
	require.ErrorContains(t, err, `the attributes of "rick" must be a JSON object`)
	_, err = evaluation.LoadSubjectFile(write(`["rick"]`))
	require.ErrorContains(t, err, "must be a JSON object of identities")
	_, err = evaluation.LoadSubjectFile(write(strings.Repeat(" ", 8<<20+1)))
	require.ErrorContains(t, err, "larger than")
}
