package arap_test

import (
	"bufio"
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/arap"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dev"
)

// decisionCounts is the arap_decisions_total lines of /metrics.
func decisionCounts(t *testing.T, base string) string {
	t.Helper()
	r := api{t: t, base: base}.do("GET", "/metrics", nil)
	require.Equal(t, 200, r.status)
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(r.body))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "arap_decisions_total{") {
			out = append(out, sc.Text())
		}
	}
	return strings.Join(out, "\n")
}

// TestEvaluationErrorBodies: AuthZEN 1.0 (section "Error Responses") answers
// an error with its HTTP status (400, 401, 403, 500) and "an error message
// string" as the body. Each bad request below gets its status and a message
// naming what is wrong, as text/plain (never a decision, never
// problem+json), with X-Request-ID echoed, and decides nothing.
func TestEvaluationErrorBodies(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{Limits: arap.Limits{MaxBody: 4096, MaxBatchBody: 8192, MaxBatchItems: 3}})
	pep := api{t: t, base: env.URL, token: dev.PEPToken}
	ok := `{"subject":{"type":"user","id":"alice"},"action":{"name":"tools/call"},"resource":{"type":"mcp_tool","id":"get_balance"}}`
	before := decisionCounts(t, env.URL)
	cases := []struct {
		name, path, body string
		status           int
		want             []string
	}{
		{"malformed JSON", "evaluation", `{"subject":`, 400, []string{"the body is not valid JSON"}},
		{"trailing garbage", "evaluation", ok + `}`, 400, []string{"not valid JSON"}},
		{"an array body", "evaluation", `[` + ok + `]`, 400, []string{"the body must be a JSON object, not an array"}},
		{"a string body", "evaluation", `"allow me"`, 400, []string{"the body must be a JSON object, not string"}},
		{"an empty body", "evaluation", ``, 400, []string{"a JSON body is required"}},
		{"no subject", "evaluation", `{"action":{"name":"a"},"resource":{"type":"t","id":"1"}}`, 400, []string{"subject: is required"}},
		{"no action name", "evaluation", `{"subject":{"type":"user","id":"alice"},"action":{},"resource":{"type":"t","id":"1"}}`, 400, []string{"action.name: is required"}},
		{"no resource id", "evaluation", `{"subject":{"type":"user","id":"alice"},"action":{"name":"a"},"resource":{"type":"t"}}`, 400, []string{"resource.id: is required"}},
		{"subject not an object", "evaluation", `{"subject":"alice","action":{"name":"a"},"resource":{"type":"t","id":"1"}}`, 400, []string{"subject: expected a JSON object, got string"}},
		{"id not a string", "evaluation", `{"subject":{"type":"user","id":7},"action":{"name":"a"},"resource":{"type":"t","id":"1"}}`, 400, []string{"subject.id:"}},
		{"properties not an object", "evaluation", `{"subject":{"type":"user","id":"alice"},"action":{"name":"a"},"resource":{"type":"t","id":"1","properties":[1]}}`, 400, []string{"resource.properties:"}},
		{"context not an object", "evaluation", `{"subject":{"type":"user","id":"alice"},"action":{"name":"a"},"resource":{"type":"t","id":"1"},"context":"now"}`, 400, []string{"context: expected a JSON object, got string"}},
		{"too large", "evaluation", `{"subject":{"type":"user","id":"` + strings.Repeat("a", 5000) + `"}}`, 413, []string{"larger than the limit of 4096 bytes"}},
		{"evaluations not an array", "evaluations", `{"evaluations":{"subject":{}}}`, 400, []string{"evaluations: expected an array, got an object"}},
		{"a batch item without its action", "evaluations", `{"subject":{"type":"user","id":"alice"},"evaluations":[` + ok + `,{"resource":{"type":"t","id":"1"}}]}`, 400, []string{"evaluations[1].action: is required"}},
		{"an unknown semantic", "evaluations", `{"options":{"evaluations_semantic":"maybe"},"evaluations":[` + ok + `]}`, 400, []string{`options.evaluations_semantic: "maybe" is not one of`}},
		{"semantic not a string", "evaluations", `{"options":{"evaluations_semantic":1},"evaluations":[` + ok + `]}`, 400, []string{"options.evaluations_semantic: expected a string, got number"}},
		{"too many items", "evaluations", `{"evaluations":[` + strings.Repeat(ok+",", 3) + ok + `]}`, 413, []string{"too many evaluations in one batch; the limit is 3"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := pep.do("POST", "/access/v1/"+tc.path, tc.body, "X-Request-ID", "req-"+strings.ReplaceAll(tc.name, " ", "-"))
			t.Logf("%d %s", r.status, r.body)
			require.Equal(t, tc.status, r.status, "%s", r.body)
			require.Equal(t, "text/plain; charset=utf-8", r.header.Get("Content-Type"))
			require.Equal(t, "req-"+strings.ReplaceAll(tc.name, " ", "-"), r.header.Get("X-Request-ID"))
			for _, w := range tc.want {
				require.Contains(t, string(r.body), w)
			}
			require.NotContains(t, string(r.body), "decision")
		})
	}
	require.Equal(t, before, decisionCounts(t, env.URL), "no error decided anything")

	// Unknown members are ignored (AuthZEN 1.0: receivers MUST ignore
	// unknown fields), in the request and in its entities.
	r := pep.do("POST", "/access/v1/evaluation", `{"subject":{"type":"user","id":"alice","nickname":"al"},"action":{"name":"tools/call"},"resource":{"type":"mcp_tool","id":"get_balance"},"future_member":{"x":1}}`)
	require.Equal(t, 200, r.status, "%s", r.body)
	require.Equal(t, true, r.json(t)["decision"])
}
