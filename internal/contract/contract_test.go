package contract

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/openapi"
	"github.com/omcp/arap/requests"
)

// TestCheckerCatchesMismatches shows the checker can fail: each kind of
// answer the document does not describe is reported, and the answers it
// describes pass.
func TestCheckerCatchesMismatches(t *testing.T) {
	c, err := New()
	require.NoError(t, err)
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	json, problem, plain := hdr("Content-Type", "application/json"), hdr("Content-Type", "application/problem+json"), hdr("Content-Type", "text/plain; charset=utf-8")
	req := func(method, path, body string) *http.Request {
		r := httptest.NewRequest(method, "http://x"+path, strings.NewReader(body))
		if body != "" {
			r.Header.Set("Content-Type", "application/json")
		}
		return r
	}
	get := func(path string) *http.Request { return req("GET", path, "") }
	prob := func(code string, status int) string {
		prefix := "urn:omcp:arap:error:"
		if code == "unknown_task" || code == "duplicate_request" || code == "invalid_task_state" {
			prefix = "urn:openid:authzen:access-request:error:"
		}
		return `{"type":"` + prefix + code + `","title":"t","status":` + strconv.Itoa(status) + `,"detail":"what to fix"}`
	}
	task := `{"task":{"id":"arq_1","status":"pending","status_endpoint":"http://x/access/v1/requests/arq_1"}}`
	submission := `{"subject":{"type":"user","id":"alice"},"denial":{"binding_token":"x"}}`
	type exchange struct {
		name    string
		req     *http.Request
		reqBody string
		status  int
		header  http.Header
		body    string
	}
	pass := []exchange{
		{"a task handle", get("/access/v1/requests/arq_1"), "", 200, json, task},
		{"members at an extension point", get("/access/v1/requests/arq_1"), "", 200, json,
			`{"task":{"id":"arq_1","status":"pending","status_endpoint":"http://x/a","display":{"x":1},"links":{"ticket":"http://x/t"}},"result":{"mode":"reevaluate","x-extra":1}}`},
		{"a documented problem", get("/access/v1/requests/arq_1"), "", 404, problem, prob("unknown_task", 404)},
		{"a failure anywhere", get("/healthz"), "", 500, problem, prob("internal_error", 500)},
		{"a path not in the document", get("/v1/secret"), "", 404, problem, prob("not_found", 404)},
		{"a method not in the document", req("PUT", "/access/v1/requests/arq_1", "{}"), "{}", 405, problem, prob("method_not_allowed", 405)},
		{"a refused submission, however invalid", req("POST", "/access/v1/requests", `{"nonsense":1}`), `{"nonsense":1}`, 400, problem, prob("invalid_request", 400)},
		{"an accepted submission", req("POST", "/access/v1/requests", submission), submission, 202, hdr("Content-Type", "application/json", "Location", "http://x/access/v1/requests/arq_1"), task},
		{"AuthZEN's plain errors", req("POST", "/access/v1/evaluation", "{}"), "{}", 400, plain, "subject: missing\n"},
		{"a refused token", get("/access/v1/requests/arq_1"), "", 401, hdr("Content-Type", "application/problem+json", "WWW-Authenticate", "Bearer"), prob("unauthorized", 401)},
		{"the web UI", get("/ui/"), "", 200, hdr("Content-Type", "text/html"), "<html>"},
		{"a list in any status", get("/v1/requests?status=&limit=100&cursor="), "", 200, json, `{"requests":[]}`},
		{"a list in one status", get("/v1/requests?status=pending"), "", 200, json, `{"requests":[]}`},
	}
	for _, e := range pass {
		require.NoError(t, c.Check(e.req, []byte(e.reqBody), e.status, e.header, []byte(e.body)), e.name)
	}
	view := `{"id":"arq_1","status":"approved","rule":"r","subject":{},"action":{},"resource":{},"submitted_by":"c","created_at":"2026-11-29T00:00:00Z",
		"expires_at":"2026-11-30T00:00:00Z","approval_policy":{"quorum":1,"groups":null,"users":null,"clients":null,"kinds":null,"require_humans":0,"machines_may":null,"approved_for":1,"max_approved_for":1},
		"votes":[],"progress":{"quorum":1,"approvals":1,"require_humans":0,"human_approvals":0},"you_may_decide":false,
		"approval":{"id":"apr_1","approved_at":"2026-11-29T00:00:00Z","approved_until":"2026-11-30T00:00:00Z","state":"eyJ..."}}`
	fail := []exchange{
		{"wrong shape", get("/access/v1/requests/arq_1"), "", 200, json, `{"task":{"id":1}}`},
		{"unknown request status", get("/access/v1/requests/arq_1"), "", 200, json, `{"task":{"id":"arq_1","status":"maybe","status_endpoint":"http://x"}}`},
		{"an extra member", get("/access/v1/requests/arq_1"), "", 200, json,
			`{"task":{"id":"arq_1","status":"pending","status_endpoint":"http://x/a","owner":"alice"}}`},
		{"deciders never see approval.state", get("/v1/requests/arq_1"), "", 200, json, view},
		{"an undocumented status", get("/access/v1/requests/arq_1"), "", 418, problem, `{"type":"x","title":"t","status":418,"detail":"d"}`},
		{"a 500 that is not internal_error", get("/access/v1/requests/arq_1"), "", 500, problem, prob("not_found", 500)},
		{"a status member that is not the HTTP status", get("/access/v1/requests/arq_1"), "", 404, problem, prob("unknown_task", 400)},
		{"a problem type the status does not list", get("/access/v1/requests/arq_1"), "", 404, problem, prob("duplicate_request", 404)},
		{"a problem without detail", get("/access/v1/requests/arq_1"), "", 404, problem, `{"type":"urn:openid:authzen:access-request:error:unknown_task","title":"t","status":404}`},
		{"errors are problem documents", get("/access/v1/requests/arq_1"), "", 404, json, `{"error":"no"}`},
		{"the wrong media type", get("/access/v1/requests/arq_1"), "", 200, plain, task},
		{"no body where one is documented", get("/access/v1/requests/arq_1"), "", 200, hdr(), ""},
		{"a documented status moved", req("POST", "/access/v1/requests", submission), submission, 201, hdr("Content-Type", "application/json", "Location", "http://x/a"), task},
		{"a required header missing", get("/access/v1/requests/arq_1"), "", 401, problem, prob("unauthorized", 401)},
		{"429 without Retry-After", get("/access/v1/requests/arq_1"), "", 429, problem, prob("rate_limited", 429)},
		{"an undocumented endpoint", get("/v1/secret"), "", 200, json, `{}`},
		{"an unlisted path answered other than not_found", get("/v1/secret"), "", 404, problem, prob("unknown_task", 404)},
		{"an unlisted method answered", req("PUT", "/access/v1/requests/arq_1", "{}"), "{}", 200, json, task},
		{"HEAD answered", req("HEAD", "/healthz", ""), "", 200, json, ""},
		{"a path that only starts like the UI", get("/uix"), "", 200, hdr("Content-Type", "text/html"), "<html>"},
		{"an accepted query the document forbids", get("/v1/requests?status=maybe"), "", 200, json, `{"requests":[]}`},
		{"an accepted request the document forbids", req("POST", "/access/v1/requests", `{"subject":{"type":"user","id":"a"},"nonsense":1}`),
			`{"subject":{"type":"user","id":"a"},"nonsense":1}`, 202, hdr("Content-Type", "application/json", "Location", "http://x/a"), task},
		{"a problem document on an evaluation endpoint's 401", req("POST", "/access/v1/evaluation", "{}"), "{}", 401,
			hdr("Content-Type", "application/problem+json", "WWW-Authenticate", "Bearer"), prob("unauthorized", 401)},
	}
	for _, e := range fail {
		err := c.Check(e.req, []byte(e.reqBody), e.status, e.header, []byte(e.body))
		require.Error(t, err, e.name)
		t.Logf("%s: %v", e.name, err)
	}
}

func load(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(openapi.Spec)
	require.NoError(t, err)
	return doc
}

// TestEveryOperationListsItsAnswers: no operation falls back on a default
// response, and each lists the failures every endpoint can answer: 400 for
// a bad query, 500; and when it needs a token, 401, 403 and 429.
func TestEveryOperationListsItsAnswers(t *testing.T) {
	doc := load(t)
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			name := method + " " + path
			require.Nil(t, op.Responses.Default(), "%s has a default response", name)
			want := []string{"400", "500"}
			if op.Security == nil || len(*op.Security) > 0 {
				want = append(want, "401", "403", "429")
			}
			for _, s := range want {
				require.NotNil(t, op.Responses.Value(s), "%s does not list %s", name, s)
			}
			for s := range op.Responses.Map() {
				require.NotEmpty(t, op.Responses.Value(s).Value.Content, "%s %s has no body", name, s)
			}
		}
	}
}

// TestEveryObjectSaysWhetherItIsOpen: an object schema that names its
// members also says whether others may appear (additionalProperties false
// for the server's own objects, true at extension points), so that the
// checker refuses an extra member wherever one is not allowed.
func TestEveryObjectSaysWhetherItIsOpen(t *testing.T) {
	doc := load(t)
	seen := map[*openapi3.Schema]bool{}
	var open, closed []string
	var walk func(where string, s *openapi3.SchemaRef)
	walk = func(where string, s *openapi3.SchemaRef) {
		if s == nil || s.Value == nil || seen[s.Value] {
			return
		}
		v := s.Value
		seen[v] = true
		if len(v.Properties) > 0 && v.Type.Is("object") {
			ap, up := v.AdditionalProperties, v.UnevaluatedProperties
			require.True(t, ap.Has != nil || ap.Schema != nil || up.Has != nil || up.Schema != nil, "%s names its members but does not say whether others may appear", where)
			if ap.Has != nil && !*ap.Has {
				closed = append(closed, where)
			} else {
				open = append(open, where)
			}
		}
		for name, p := range v.Properties {
			walk(where+"."+name, p)
		}
		walk(where+"[]", v.Items)
		for _, list := range []openapi3.SchemaRefs{v.AllOf, v.OneOf, v.AnyOf} {
			for _, x := range list {
				walk(where, x)
			}
		}
	}
	names := make([]string, 0, len(doc.Components.Schemas))
	for name := range doc.Components.Schemas {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		walk(name, doc.Components.Schemas[name])
	}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if op.RequestBody != nil {
				for _, mt := range op.RequestBody.Value.Content {
					walk(method+" "+path+" request", mt.Schema)
				}
			}
			for status, r := range op.Responses.Map() {
				for _, mt := range r.Value.Content {
					walk(method+" "+path+" "+status, mt.Schema)
				}
			}
		}
	}
	sort.Strings(open)
	t.Logf("open objects (extension points, and requests whose other members the server ignores): %s", strings.Join(open, ", "))
	require.Contains(t, closed, "TaskResponse")
	require.Contains(t, closed, "Problem")
}

// TestStatusEnumMatchesStateMachine keeps the document's request states and
// the state machine's the same set.
func TestStatusEnumMatchesStateMachine(t *testing.T) {
	doc := load(t)
	var inDoc []string
	for _, v := range doc.Components.Schemas["RequestStatus"].Value.Enum {
		inDoc = append(inDoc, v.(string))
	}
	var inCode []string
	for _, s := range requests.AllStatuses {
		inCode = append(inCode, string(s))
	}
	require.ElementsMatch(t, inCode, inDoc)
}

// TestProxyChecksAndKeepsTheSourceAddress: the proxy fails the test on an
// answer the document does not describe, passes the request body on
// unchanged, and reaches the backend from the client's loopback address.
func TestProxyChecksAndKeepsTheSourceAddress(t *testing.T) {
	var seenFrom, seenBody string
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seenFrom = r.RemoteAddr
		b, _ := io.ReadAll(r.Body)
		seenBody = string(b)
		if r.URL.Path == "/teapot" {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(418)
			_, _ = w.Write([]byte(`{"type":"x","title":"t","status":418,"detail":"d"}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}`))
	}))
	defer backend.Close()

	rec := &recorder{TB: t}
	url := Proxy(rec, backend.URL, nil)
	resp, err := http.Post(url+"/healthz", "application/json", strings.NewReader(`{"a":1}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, `{"a":1}`, seenBody)
	require.Len(t, rec.errors, 1, "POST /healthz is not in the document")

	// From another loopback address: the backend sees that address.
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	from2 := &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
	resp, err = from2.Get(url + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Len(t, rec.errors, 1, "GET /healthz is")
	require.True(t, strings.HasPrefix(seenFrom, "127.0.0.2:"), seenFrom)

	resp, err = http.Get(url + "/teapot")
	require.NoError(t, err)
	resp.Body.Close()
	require.Len(t, rec.errors, 2)
	require.Contains(t, rec.errors[1], "418")
}

// recorder collects the errors the proxy reports instead of failing.
type recorder struct {
	testing.TB
	errors []string
}

// Errorf runs in the proxy's handler, before the client has its answer.
func (r *recorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}
