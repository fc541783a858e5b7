package arap_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/arap"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/openapi"
	"github.com/omcp/arap/signing"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

type api struct {
	t     *testing.T
	base  string
	token string
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(r.body, &m), "body: %s", r.body)
	return m
}

// problem checks r is an RFC 9457 document of the given code and status.
func (r reply) problem(t *testing.T, status int, code string) map[string]any {
	t.Helper()
	require.Equal(t, status, r.status, "body: %s", r.body)
	require.Equal(t, authzen.ProblemContentType, r.header.Get("Content-Type"))
	m := r.json(t)
	require.Equal(t, authzen.ProblemType(code), m["type"])
	require.EqualValues(t, status, m["status"])
	require.NotEmpty(t, m["title"])
	require.NotEmpty(t, m["detail"], "every problem tells the caller what to fix")
	return m
}

func (a api) do(method, path string, body any, headers ...string) reply {
	a.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		require.NoError(a.t, err)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, a.base+path, rd)
	require.NoError(a.t, err)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(a.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(a.t, err)
	return reply{resp.StatusCode, resp.Header, b}
}

func wireCall(amount float64) map[string]any {
	return map[string]any{
		"subject":  map[string]any{"type": "user", "id": "alice", "properties": map[string]any{"act": map[string]any{"sub": "agent:demo"}}},
		"action":   map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": "wire_transfer", "properties": map[string]any{"arguments": map[string]any{"to": "acct-991", "amount": amount}}},
	}
}

// submission turns an evaluation and its requestable denial into a body.
func submission(t *testing.T, call map[string]any, denial map[string]any) map[string]any {
	t.Helper()
	ctx := denial["context"].(map[string]any)
	hint := ctx["access_request"].(map[string]any)
	body := map[string]any{}
	for k, v := range call {
		body[k] = v
	}
	body["denial"] = map[string]any{
		"evaluation_id": ctx["evaluation_id"], "expires_at": hint["expires_at"], "binding_token": hint["binding_token"],
		"reason": ctx["reason"], "template": hint["template"],
	}
	return body
}

func TestDiscoveryJWKSAndOperations(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{})
	anon := api{t: t, base: env.URL}
	r := anon.do("GET", authzen.WellKnownPath, nil)
	require.Equal(t, 200, r.status)
	md := r.json(t)
	require.Equal(t, env.URL, md["policy_decision_point"])
	require.Equal(t, env.URL+"/access/v1/evaluation", md["access_evaluation_endpoint"])
	require.Equal(t, env.URL+"/access/v1/evaluations", md["access_evaluations_endpoint"])
	require.Equal(t, env.URL+"/access/v1/requests", md["access_request_endpoint"])
	require.Equal(t, env.URL+"/access/v1/jwks", md["jwks_uri"])
	require.Equal(t, []any{"urn:openid:authzen:capability:access-request"}, md["capabilities"])

	r = anon.do("GET", "/access/v1/jwks", nil)
	require.Equal(t, 200, r.status)
	var set signing.JWKSet
	require.NoError(t, json.Unmarshal(r.body, &set))
	require.Len(t, set.Keys, 1)
	require.Equal(t, env.Backend.Keys().ActiveKid(), set.Keys[0].Kid)

	require.Equal(t, 200, anon.do("GET", "/healthz", nil).status)
	require.Equal(t, 200, anon.do("GET", "/readyz", nil).status)
	require.Equal(t, 200, anon.do("GET", "/ui/login", nil).status)
	m := anon.do("GET", "/metrics", nil)
	require.Equal(t, 200, m.status)
	require.Contains(t, string(m.body), "arap_http_requests_total")
	// The web UI's routes are named once (issue 38: "/ui/ui/login" before).
	require.Contains(t, string(m.body), `arap_http_requests_total{code="200",method="GET",route="/ui/login"}`)
	require.NotContains(t, string(m.body), "/ui/ui/")
	require.Regexp(t, `(?m)^arap_build_info\{goversion="go[^"]+",revision="[^"]+",version="[^"]+"\} 1$`, string(m.body))
	doc := anon.do("GET", "/openapi.yaml", nil)
	require.Equal(t, 200, doc.status)
	require.Equal(t, openapi.Spec, doc.body)
}

func TestEvaluateOverHTTP(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{})
	pep := api{t: t, base: env.URL, token: dev.PEPToken}

	r := pep.do("POST", "/access/v1/evaluation", wireCall(100), authzen.HeaderRequestID, "trace-123")
	require.Equal(t, 200, r.status)
	require.Equal(t, "trace-123", r.header.Get(authzen.HeaderRequestID), "X-Request-ID is echoed")
	require.Equal(t, true, r.json(t)["decision"])

	r = pep.do("POST", "/access/v1/evaluation", wireCall(50000))
	require.Equal(t, 200, r.status)
	d := r.json(t)
	require.Equal(t, false, d["decision"])
	ctx := d["context"].(map[string]any)
	require.Equal(t, "approval_required", ctx["reason"])
	require.NotEmpty(t, ctx["evaluation_id"])
	require.NotEmpty(t, ctx["evaluated_at"])
	hint := ctx["access_request"].(map[string]any)
	for _, k := range []string{"expires_at", "binding_token", "display", "template", "endpoint"} {
		require.NotEmpty(t, hint[k], k)
	}
	require.Equal(t, env.URL+"/access/v1/requests", hint["endpoint"])

	// Batch: defaults plus items, each semantic.
	batch := map[string]any{
		"subject": wireCall(0)["subject"], "action": map[string]any{"name": "tools/call"},
		"evaluations": []any{
			map[string]any{"resource": map[string]any{"type": "mcp_tool", "id": "get_balance"}},
			map[string]any{"resource": map[string]any{"type": "mcp_tool", "id": "format_disk"}},
			map[string]any{"resource": map[string]any{"type": "mcp_tool", "id": "get_balance"}},
		},
	}
	for _, c := range []struct {
		semantic string
		want     int
	}{{"", 3}, {"execute_all", 3}, {"deny_on_first_deny", 2}, {"permit_on_first_permit", 1}} {
		semantic, want := c.semantic, c.want
		delete(batch, "options")
		if semantic != "" {
			batch["options"] = map[string]any{"evaluations_semantic": semantic}
		}
		r = pep.do("POST", "/access/v1/evaluations", batch)
		require.Equal(t, 200, r.status, "%s", r.body)
		require.Len(t, r.json(t)["evaluations"], want, semantic)
	}
	// Without items the batch endpoint answers one decision.
	r = pep.do("POST", "/access/v1/evaluations", wireCall(100))
	require.Equal(t, 200, r.status)
	require.Equal(t, true, r.json(t)["decision"])

	// The request schema of a template is served to API clients.
	r = pep.do("GET", "/access/v1/schemas/customer_data_access", nil)
	require.Equal(t, 200, r.status)
	sch := r.json(t)
	require.Equal(t, env.URL+"/access/v1/schemas/customer_data_access", sch["$id"])
	require.Contains(t, string(r.body), "business_justification")
	pep.do("GET", "/access/v1/schemas/treasury_approval", nil).problem(t, 404, authzen.ProblemNotFound)
}

func TestEvaluationErrorsArePlainAuthZEN(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{Limits: arap.Limits{MaxBody: 2048}})
	pep := api{t: t, base: env.URL, token: dev.PEPToken}
	check := func(r reply, status int, text string) {
		t.Helper()
		require.Equal(t, status, r.status, "%s", r.body)
		require.True(t, strings.HasPrefix(r.header.Get("Content-Type"), "text/plain"), r.header.Get("Content-Type"))
		require.Contains(t, string(r.body), text)
	}
	r := api{t: t, base: env.URL}.do("POST", "/access/v1/evaluation", wireCall(1))
	check(r, 401, "Authorization: Bearer")
	require.Contains(t, r.header.Get("WWW-Authenticate"), "Bearer")
	check(api{t: t, base: env.URL, token: "nope-nope-nope"}.do("POST", "/access/v1/evaluation", wireCall(1)), 401, "unknown or revoked")
	check(api{t: t, base: env.URL, token: dev.ITSMToken}.do("POST", "/access/v1/evaluation", wireCall(1)), 403, "evaluate scope")
	check(pep.do("POST", "/access/v1/evaluation", `{"subject":`), 400, "not valid JSON")
	check(pep.do("POST", "/access/v1/evaluation", map[string]any{"subject": map[string]any{"type": "user"}}), 400, "subject.id: is required; provide an id")
	check(pep.do("POST", "/access/v1/evaluation", map[string]any{"subject": "alice"}), 400, "subject: expected")
	check(pep.do("POST", "/access/v1/evaluation", strings.Repeat(" ", 4096)), 413, "larger than the limit")
	check(pep.do("POST", "/access/v1/evaluation", wireCall(1), "Content-Type", "text/plain"), 415, "application/json")
	check(pep.do("POST", "/access/v1/evaluations", map[string]any{"options": map[string]any{"evaluations_semantic": "maybe"}, "evaluations": []any{wireCall(1)}}), 400, "evaluations_semantic")
}

func TestRequestLifecycleOverHTTP(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{})
	pep := api{t: t, base: env.URL, token: dev.PEPToken}
	call := wireCall(50000)
	denial := pep.do("POST", "/access/v1/evaluation", call).json(t)
	body := submission(t, call, denial)

	r := pep.do("POST", "/access/v1/requests", body, "Idempotency-Key", "k-1")
	require.Equal(t, 202, r.status, "%s", r.body)
	task := r.json(t)["task"].(map[string]any)
	id := task["id"].(string)
	require.Equal(t, "pending", task["status"])
	require.Equal(t, env.URL+"/access/v1/requests/"+id, task["status_endpoint"])
	require.Equal(t, task["status_endpoint"], r.header.Get("Location"))
	require.Equal(t, env.URL+"/access/v1/requests/"+id+"/cancel", task["links"].(map[string]any)["cancel"])
	require.NotEmpty(t, task["expires_at"])

	r = pep.do("POST", "/access/v1/requests", body, "Idempotency-Key", "k-1")
	require.Equal(t, 202, r.status)
	require.Equal(t, id, r.json(t)["task"].(map[string]any)["id"])
	require.Equal(t, "true", r.header.Get(authzen.HeaderIdempotentReplayed))

	other := submission(t, call, denial)
	other["context"] = map[string]any{"note": "different"}
	pep.do("POST", "/access/v1/requests", other, "Idempotency-Key", "k-1").problem(t, 409, authzen.ProblemDuplicateRequest)

	r = pep.do("GET", "/access/v1/requests/"+id, nil)
	require.Equal(t, 200, r.status)
	require.Equal(t, "pending", r.json(t)["task"].(map[string]any)["status"])
	require.NotEmpty(t, r.header.Get("Retry-After"))

	// Only the submitting client sees the task.
	itsm := api{t: t, base: env.URL, token: dev.ITSMToken}
	itsm.do("GET", "/access/v1/requests/"+id, nil).problem(t, 403, authzen.ProblemInsufficientScope)

	r = pep.do("POST", "/access/v1/requests/"+id+"/cancel", map[string]any{"reason": "user_abandoned", "comment": "no longer needed"})
	require.Equal(t, 200, r.status, "%s", r.body)
	require.Equal(t, "cancelled", r.json(t)["task"].(map[string]any)["status"])
	pep.do("POST", "/access/v1/requests/"+id+"/cancel", nil).problem(t, 409, authzen.ProblemInvalidTaskState)
	pep.do("DELETE", "/access/v1/requests/"+id+"/cancel", nil).problem(t, 409, authzen.ProblemInvalidTaskState)

	// DELETE on a fresh request cancels it too.
	call = wireCall(60000)
	r = pep.do("POST", "/access/v1/requests", submission(t, call, pep.do("POST", "/access/v1/evaluation", call).json(t)))
	require.Equal(t, 202, r.status)
	id2 := r.json(t)["task"].(map[string]any)["id"].(string)
	r = pep.do("DELETE", "/access/v1/requests/"+id2, nil)
	require.Equal(t, 200, r.status)
	require.Equal(t, "cancelled", r.json(t)["task"].(map[string]any)["status"])
}

// TestEveryProblemType provokes each error over HTTP and checks the status,
// the problem type and that nothing was created.
func TestEveryProblemType(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{RequestRetention: time.Hour, Limits: arap.Limits{MaxBody: 8 << 10}})
	pep := api{t: t, base: env.URL, token: dev.PEPToken}
	ctx := context.Background()
	fresh := func(amount float64) map[string]any {
		call := wireCall(amount)
		return submission(t, call, pep.do("POST", "/access/v1/evaluation", call).json(t))
	}
	requests := func() int {
		var n int
		require.NoError(t, env.Pool.QueryRow(ctx, "SELECT count(*) FROM arap.requests").Scan(&n))
		return n
	}
	// A validly signed but expired binding token, made with the deployment's key.
	keys, err := signing.Open(ctx, env.Pool, signing.Options{MasterKey: make([]byte, 32)})
	require.NoError(t, err)
	expiredBody := fresh(50000)
	var claims evaluation.BindingClaims
	require.NoError(t, keys.Verify(ctx, signing.TypeBinding, expiredBody["denial"].(map[string]any)["binding_token"].(string), &claims))
	past := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
	claims.ExpiresAt = jwt.NewNumericDate(past)
	claims.DenialExpiresAt = past.Format(time.RFC3339)
	tok, err := keys.Sign(ctx, signing.TypeBinding, claims)
	require.NoError(t, err)
	expiredBody["denial"].(map[string]any)["binding_token"] = tok
	expiredBody["denial"].(map[string]any)["expires_at"] = claims.DenialExpiresAt

	cases := []struct {
		name   string
		do     func() reply
		status int
		code   string
	}{
		{"not_requestable", func() reply {
			b := fresh(50000)
			delete(b, "denial")
			return pep.do("POST", "/access/v1/requests", b)
		}, 400, authzen.ProblemNotRequestable},
		{"expired_denial", func() reply { return pep.do("POST", "/access/v1/requests", expiredBody) }, 410, authzen.ProblemExpiredDenial},
		{"invalid_denial_binding", func() reply {
			b := fresh(50000)
			b["resource"] = wireCall(40000)["resource"]
			return pep.do("POST", "/access/v1/requests", b)
		}, 400, authzen.ProblemInvalidDenialBinding},
		{"unknown_task", func() reply { return pep.do("GET", "/access/v1/requests/arq_DOESNOTEXIST", nil) }, 404, authzen.ProblemUnknownTask},
		{"invalid_request", func() reply { return pep.do("POST", "/access/v1/requests", `{"subject":`) }, 400, authzen.ProblemInvalidRequest},
		{"unsupported", func() reply {
			b := fresh(50000)
			b["items"] = []any{map[string]any{}}
			return pep.do("POST", "/access/v1/requests", b)
		}, 400, authzen.ProblemUnsupported},
		{"schema_violation", func() reply {
			call := wireCall(0)
			call["resource"] = map[string]any{"type": "mcp_tool", "id": "read_customer_record", "properties": map[string]any{"arguments": map[string]any{"customer_id": "c-1"}}}
			b := submission(t, call, pep.do("POST", "/access/v1/evaluation", call).json(t))
			b["context"] = map[string]any{"business_justification": "too short"}
			return pep.do("POST", "/access/v1/requests", b)
		}, 400, authzen.ProblemSchemaViolation},
		{"invalid_idempotency_key", func() reply {
			return pep.do("POST", "/access/v1/requests", fresh(50000), "Idempotency-Key", strings.Repeat("x", 300))
		}, 400, authzen.ProblemInvalidIdempotencyKey},
		{"actor_not_authorized", func() reply {
			b := fresh(50000)
			b["client"] = map[string]any{"actor": map[string]any{"id": "user:admin"}}
			return pep.do("POST", "/access/v1/requests", b)
		}, 403, authzen.ProblemActorNotAuthorized},
		{"unauthorized", func() reply { return api{t: t, base: env.URL}.do("GET", "/access/v1/requests/x", nil) }, 401, authzen.ProblemUnauthorized},
		{"insufficient_scope", func() reply {
			return api{t: t, base: env.URL, token: dev.ResolverToken}.do("POST", "/access/v1/requests", fresh(50000))
		}, 403, authzen.ProblemInsufficientScope},
		{"payload_too_large", func() reply {
			return pep.do("POST", "/access/v1/requests", `{"x":"`+strings.Repeat("a", 9000)+`"}`)
		}, 413, authzen.ProblemPayloadTooLarge},
		{"unsupported_media_type", func() reply {
			return pep.do("POST", "/access/v1/requests", fresh(50000), "Content-Type", "application/x-www-form-urlencoded")
		}, 415, authzen.ProblemUnsupportedMediaType},
		{"method_not_allowed", func() reply { return pep.do("PUT", "/access/v1/requests/x", "{}") }, 405, authzen.ProblemMethodNotAllowed},
		{"not_found", func() reply { return pep.do("GET", "/access/v2/nothing", nil) }, 404, authzen.ProblemNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := requests()
			tc.do().problem(t, tc.status, tc.code)
			require.Equal(t, before, requests(), "an error changes nothing")
		})
	}

	// duplicate_request, invalid_task_state and task_expired need a request.
	b := fresh(50000)
	r := pep.do("POST", "/access/v1/requests", b, "Idempotency-Key", "dup")
	require.Equal(t, 202, r.status)
	id := r.json(t)["task"].(map[string]any)["id"].(string)
	b["context"] = map[string]any{"x": 1}
	pep.do("POST", "/access/v1/requests", b, "Idempotency-Key", "dup").problem(t, 409, authzen.ProblemDuplicateRequest)
	require.Equal(t, 200, pep.do("POST", "/access/v1/requests/"+id+"/cancel", nil).status)
	pep.do("POST", "/access/v1/requests/"+id+"/cancel", nil).problem(t, 409, authzen.ProblemInvalidTaskState)
	// Past its retention, the request is gone. The retention is an hour
	// (so the 409 above never races it); the request ended two hours ago.
	_, err = env.Pool.Exec(ctx, `UPDATE arap.requests SET terminal_at = terminal_at - interval '2 hours' WHERE id = $1`, id)
	require.NoError(t, err)
	pep.do("GET", "/access/v1/requests/"+id, nil).problem(t, 410, authzen.ProblemTaskExpired)
}

// TestInternalErrorsAreDocumented: when the database fails under a request
// (here, the API clients' table is gone), ARAP and the decision API answer
// 500 internal_error, the evaluation endpoint AuthZEN's plain text, and
// neither shows what failed; through the contract proxy, as every test.
func TestInternalErrorsAreDocumented(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{})
	ctx := context.Background()
	_, err := env.Pool.Exec(ctx, `ALTER TABLE arap.api_clients RENAME TO api_clients_gone`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = env.Pool.Exec(ctx, `ALTER TABLE arap.api_clients_gone RENAME TO api_clients`) })

	pep := api{t: t, base: env.URL, token: dev.PEPToken}
	for _, r := range []reply{pep.do("GET", "/access/v1/requests/arq_x", nil), api{t: t, base: env.URL, token: dev.ITSMToken}.do("GET", "/v1/requests", nil)} {
		m := r.problem(t, 500, authzen.ProblemInternal)
		require.Contains(t, m["detail"], "X-Request-ID")
		require.NotContains(t, string(r.body), "api_clients", "what failed stays in the logs")
		require.NotEmpty(t, r.header.Get(authzen.HeaderRequestID))
	}
	r := pep.do("POST", "/access/v1/evaluation", wireCall(1))
	require.Equal(t, 500, r.status)
	require.True(t, strings.HasPrefix(r.header.Get("Content-Type"), "text/plain"), r.header.Get("Content-Type"))
	require.NotContains(t, string(r.body), "api_clients")
}

// TestRateLimit: a client's budget and the budget of refused
// authentications per address are shared by every replica on the database
// (here two), counted exactly, and answered 429 with Retry-After.
func TestRateLimit(t *testing.T) {
	limits := arap.Limits{RequestsPerMinute: 3, UnauthenticatedPerMinute: 2}
	env := backendtest.Start(t, backendtest.Options{Limits: limits})
	other := backendtest.Start(t, backendtest.Options{Limits: limits, Join: env})
	replicas := []api{{t: t, base: env.URL, token: dev.PEPToken}, {t: t, base: other.URL, token: dev.PEPToken}}
	for i := range 3 {
		require.Equal(t, 404, replicas[i%2].do("GET", "/access/v1/requests/arq_x", nil).status)
	}
	for _, pep := range replicas {
		r := pep.do("GET", "/access/v1/requests/arq_x", nil)
		r.problem(t, 429, authzen.ProblemRateLimited)
		require.NotEmpty(t, r.header.Get("Retry-After"))
	}
	// Another client has its own budget (it lacks the scope, but is not limited).
	require.Equal(t, 403, api{t: t, base: other.URL, token: dev.ITSMToken}.do("GET", "/access/v1/requests/arq_x", nil).status)

	// Wrong tokens: two refusals per address, whichever replica answers.
	require.Equal(t, 401, api{t: t, base: env.URL, token: "wrong"}.do("GET", "/access/v1/requests/arq_x", nil).status)
	require.Equal(t, 401, api{t: t, base: other.URL, token: "wrong"}.do("GET", "/access/v1/requests/arq_x", nil).status)
	r := api{t: t, base: env.URL, token: "wrong"}.do("GET", "/access/v1/requests/arq_x", nil)
	r.problem(t, 429, authzen.ProblemRateLimited)
	require.NotEmpty(t, r.header.Get("Retry-After"))
}
