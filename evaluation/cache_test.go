package evaluation_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/signing"
)

// fixedAttributes is an AttributeSource that never changes.
type fixedAttributes map[string]any

func (a fixedAttributes) Snapshot(context.Context) (map[string]any, error) { return a, nil }

const cachePolicy = `version: 1
windows:
  always: {days: [mon, tue, wed, thu, fri, sat, sun], from: "00:00", to: "23:59", timezone: UTC}
subject_attributes: {source: people}
definitions:
  frozen: "has(attributes.freeze) && attributes.freeze == true"
rules:
  - name: plain
    match: {action: plain}
    effect: allow
  - name: by_arguments
    match: {action: arguments}
    when: resource.properties.n < 10
    effect: allow
  - name: in_window
    match: {action: window}
    when: windows.always
    effect: allow
  - name: by_clock
    match: {action: clock}
    when: now > timestamp("2000-01-01T00:00:00Z")
    effect: allow
  - name: freeze
    match: {action: guarded}
    when: frozen
    effect: deny
  - name: guarded
    match: {action: guarded}
    effect: allow
  - name: late_deny
    match: {action: after_window}
    when: windows.always && resource.properties.n > 100
    effect: deny
  - name: after_window
    match: {action: after_window}
    effect: allow
  - name: big_in_window
    match: {action: short}
    when: resource.properties.n > 100 && windows.always
    effect: deny
  - name: short
    match: {action: short}
    effect: allow
  - name: known_people
    match: {action: people}
    when: "'id' in subject_attributes"
    effect: allow
  - name: other_rule_not_tried
    match: {action: not_this_one}
    when: windows.always
    effect: deny
  - name: unrelated
    match: {action: unrelated}
    effect: allow
  - name: ask
    match: {action: ask}
    effect: request
    approval: {quorum: 1, groups: [g]}
  - name: refuse
    match: {action: refuse}
    effect: deny
`

func cacheEngine(t *testing.T, c evaluation.CacheOptions) *evaluation.Engine {
	t.Helper()
	p, err := evaluation.Parse("p.yaml", []byte(cachePolicy))
	require.NoError(t, err)
	keys, err := signing.Open(context.Background(), dbtest.New(t), signing.Options{MasterKey: make([]byte, 32)})
	require.NoError(t, err)
	e, err := evaluation.New(evaluation.Options{Policy: p, Keys: keys, Issuer: issuer, RequestsURL: requestsURL,
		SubjectSources: map[string]evaluation.SubjectSource{"people": people()},
		Attributes:     fixedAttributes{"freeze": false}, Cache: c, Now: func() time.Time { return fixed }})
	require.NoError(t, err)
	return e
}

// TestCacheableDecisions: an allow is marked cacheable (context[CtxCache],
// with the configured max age) only when every condition evaluated to
// reach it read nothing but the request and announced inputs; denials,
// requestable denials, and allows reached through the clock never are.
func TestCacheableDecisions(t *testing.T) {
	t.Parallel()
	announced := evaluation.CacheOptions{MaxAge: 90 * time.Second, Attributes: true, Sources: []string{"people"}}
	all := cacheEngine(t, announced)
	noAttributes := cacheEngine(t, evaluation.CacheOptions{MaxAge: 90 * time.Second, Sources: []string{"people"}})
	noSources := cacheEngine(t, evaluation.CacheOptions{MaxAge: 90 * time.Second, Attributes: true})
	off := cacheEngine(t, evaluation.CacheOptions{Attributes: true, Sources: []string{"people"}})
	req := func(action string, n int) authzen.EvaluationRequest {
		return ask("user", "u-1", action, authzen.Object{"type": "doc", "id": "1", "properties": map[string]any{"n": n}})
	}
	cases := []struct {
		name     string
		e        *evaluation.Engine
		req      authzen.EvaluationRequest
		decision bool
		maxAge   time.Duration
	}{
		{"no condition", all, req("plain", 1), true, 90 * time.Second},
		{"the request's arguments only", all, req("arguments", 1), true, 90 * time.Second},
		{"a window", all, req("window", 1), true, 0},
		{"the clock", all, req("clock", 1), true, 0},
		{"an announced attribute, through a definition, in an earlier rule", all, req("guarded", 1), true, 90 * time.Second},
		{"an attribute whose changes are not announced", noAttributes, req("guarded", 1), true, 0},
		{"an earlier rule read a window", all, req("after_window", 1), true, 0},
		{"an earlier rule stopped before its window", all, req("short", 1), true, 90 * time.Second},
		{"a rule read its window and denied", all, req("short", 101), false, 0},
		{"an announced subject source", all, req("people", 1), true, 90 * time.Second},
		{"a subject source whose changes are not announced", noSources, req("people", 1), true, 0},
		{"a rule that does not match is not evaluated", all, req("unrelated", 1), true, 90 * time.Second},
		{"no max age", off, req("plain", 1), true, 0},
		{"a requestable denial", all, req("ask", 1), false, 0},
		{"a denial", all, req("refuse", 1), false, 0},
		{"no rule whose condition holds", all, req("arguments", 11), false, 0},
		{"no rule", all, req("nothing", 1), false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := tc.e.Evaluate(context.Background(), "cli_test", tc.req)
			require.NoError(t, err)
			require.Equal(t, tc.decision, out.Decision.Decision)
			require.Equal(t, tc.maxAge, out.Decision.Cacheable())
			if tc.maxAge == 0 {
				require.NotContains(t, out.Decision.Context, authzen.CtxCache)
			}
		})
	}
}

// TestCacheHintOnTheWire: the marker survives JSON as a PEP reads it, and a
// hint on a denial, or a malformed one, is no reuse.
func TestCacheHintOnTheWire(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		d    authzen.Decision
		want time.Duration
	}{
		{authzen.Decision{Decision: true, Context: authzen.Object{authzen.CtxCache: map[string]any{"max_age": float64(30)}}}, 30 * time.Second},
		{authzen.Decision{Decision: false, Context: authzen.Object{authzen.CtxCache: map[string]any{"max_age": float64(30)}}}, 0},
		{authzen.Decision{Decision: true, Context: authzen.Object{authzen.CtxCache: "forever"}}, 0},
		{authzen.Decision{Decision: true, Context: authzen.Object{authzen.CtxCache: map[string]any{"max_age": float64(-5)}}}, 0},
		{authzen.Decision{Decision: true, Context: authzen.Object{authzen.CtxCache: map[string]any{"max_age": 1e12}}}, 24 * time.Hour},
		{authzen.Decision{Decision: true}, 0},
	} {
		require.Equal(t, tc.want, tc.d.Cacheable(), "%v", tc.d)
	}
}
