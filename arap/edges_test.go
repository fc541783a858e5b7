package arap_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/requests"
)

// badSegments are path segments and query values that decode to bytes
// PostgreSQL refuses in text (NUL, invalid UTF-8) or that no id contains.
var badSegments = []string{
	"%00", "arq_%00", "arq_AAAAAAAAAAAAAAAAAAAAAAAAA%00", "%ff", "%FF", "arq_%ff%fe", "%C0%AF", "%ED%A0%80", "%E2%82", "%01", "%7F",
	"%00%00%00%00%00%00%00%00%00%00%00%00%00%00%00%00",
}

// TestBadBytesInPathsAndQueries sends NUL, invalid UTF-8 and control bytes
// in every path parameter and query value of the backend (ARAP, the
// decision API, deliveries, the web UI): each gets 400 or 404 with a clear
// error, never a 500 (PostgreSQL refuses such text, which is where 500s
// came from).
func TestBadBytesInPathsAndQueries(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{})
	pep := api{t: t, base: env.URL, token: dev.PEPToken}
	itsm := api{t: t, base: env.URL, token: dev.ITSMToken}
	call := wireCall(50000)
	r := pep.do("POST", "/access/v1/requests", submission(t, call, pep.do("POST", "/access/v1/evaluation", call).json(t)))
	require.Equal(t, 202, r.status)
	id := r.json(t)["task"].(map[string]any)["id"].(string)

	routes := []struct {
		as     api
		method string
		path   string // X marks the bad value
		body   any
	}{
		{pep, "GET", "/access/v1/requests/X", nil},
		{pep, "POST", "/access/v1/requests/X/cancel", nil},
		{pep, "DELETE", "/access/v1/requests/X/cancel", nil},
		{pep, "DELETE", "/access/v1/requests/X", nil},
		{pep, "GET", "/access/v1/schemas/X", nil},
		{pep, "GET", "/v1/requests/X/deliveries", nil},
		{pep, "POST", "/v1/requests/X/deliveries/msg_1/redeliver", nil},
		{pep, "POST", "/v1/requests/" + id + "/deliveries/X/redeliver", nil},
		{itsm, "GET", "/v1/requests/X", nil},
		{itsm, "POST", "/v1/requests/X/decisions", map[string]any{"decision": "approve"}},
		{itsm, "POST", "/v1/approvals/X/revoke", nil},
		{itsm, "GET", "/v1/requests?status=X", nil},
		{itsm, "GET", "/v1/requests?rule=X", nil},
		{itsm, "GET", "/v1/requests?cursor=X", nil},
		{itsm, "GET", "/v1/requests?limit=X", nil},
		{itsm, "GET", "/v1/requests?X=1", nil},
		{pep, "GET", "/X", nil},
		{pep, "GET", "/access/v1/X", nil},
		{pep, "GET", "/.well-known/X", nil},
		{pep, "GET", "/healthz?X", nil},
	}
	// A cursor of the right shape whose id holds bad bytes.
	cursors := []string{}
	for _, inner := range []string{"\x00", "\xff", "arq_\x00"} {
		cursors = append(cursors, base64.RawURLEncoding.EncodeToString([]byte(time.Now().UTC().Format(time.RFC3339Nano)+"|"+inner)))
	}
	for _, rt := range routes {
		values := badSegments
		if strings.Contains(rt.path, "cursor=") {
			values = append(append([]string{}, badSegments...), cursors...)
		}
		for _, bad := range values {
			path := strings.Replace(rt.path, "X", bad, 1)
			r := rt.as.do(rt.method, path, rt.body)
			require.Contains(t, []int{400, 404}, r.status, "%s %s: %s", rt.method, path, r.body)
			require.Equal(t, "application/problem+json", r.header.Get("Content-Type"), "%s %s", rt.method, path)
			require.NotEmpty(t, r.json(t)["detail"], "%s %s", rt.method, path)
		}
	}

	// Behind the routes, the services refuse malformed ids themselves.
	for _, bad := range []string{"msg_\x00", "msg_\xff", "\x00"} {
		err := env.Backend.Callbacks().Redeliver(context.Background(), id, bad, "test")
		require.Equal(t, authzen.ProblemNotFound, requests.ErrorCode(err), "%v", err)
	}

	// The web UI: its pages answer in plain text, also never 500.
	b := newUIBrowser(t, env.URL)
	b.signIn()
	for _, path := range []string{"/ui/requests/X", "/ui/?rule=X", "/ui/?show=X", "/ui/history?X=1", "/ui/login?next=X", "/ui/X", "/ui/assets/X"} {
		for _, bad := range badSegments {
			p := strings.Replace(path, "X", bad, 1)
			r := b.get(p)
			require.Contains(t, []int{400, 404}, r.status, "GET %s: %s", p, r.body)
			require.NotEmpty(t, r.body)
		}
	}
	for _, bad := range badSegments {
		p := "/ui/requests/" + bad + "/decide"
		r := b.post(p, "decision=approve&csrf="+b.csrf)
		require.Contains(t, []int{400, 404}, r.status, "POST %s: %s", p, r.body)
	}
	// The sign-in form: a user name no account can have is a wrong one.
	login := newUIBrowser(t, env.URL)
	for _, name := range []string{"%00", "bob%00", "%ff", "b%C0%AFob"} {
		r := login.postLogin(name, dev.Password)
		require.Equal(t, http.StatusUnauthorized, r.status, "user name %s: %s", name, r.body)
		require.Contains(t, r.body, "Wrong user name or password.")
	}
}

// uiBrowser is a cookie-keeping client of the web UI, signed in as bob.
type uiBrowser struct {
	t    *testing.T
	base string
	c    *http.Client
	csrf string
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func newUIBrowser(t *testing.T, base string) *uiBrowser {
	jar, _ := cookiejar.New(nil)
	b := &uiBrowser{t: t, base: base, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
	return b
}

// signIn signs in as bob and keeps the session's CSRF token.
func (b *uiBrowser) signIn() {
	r := b.postLogin("bob", dev.Password)
	require.Equal(b.t, http.StatusSeeOther, r.status, "%s", r.body)
	m := csrfField.FindStringSubmatch(b.get("/ui/").body)
	require.NotNil(b.t, m)
	b.csrf = m[1]
}

type uiPage struct {
	status int
	body   string
}

func (b *uiBrowser) do(method, path, form string) uiPage {
	b.t.Helper()
	req, err := http.NewRequest(method, b.base+path, strings.NewReader(form))
	require.NoError(b.t, err)
	if form != "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := b.c.Do(req)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(b.t, err)
	return uiPage{resp.StatusCode, string(body)}
}

func (b *uiBrowser) get(path string) uiPage { return b.do("GET", path, "") }

func (b *uiBrowser) post(path, form string) uiPage { return b.do("POST", path, form) }

// postLogin posts the sign-in form; user is sent as it is (already encoded).
func (b *uiBrowser) postLogin(user, password string) uiPage {
	m := csrfField.FindStringSubmatch(b.get("/ui/login").body)
	require.NotNil(b.t, m)
	return b.post("/ui/login", "csrf="+url.QueryEscape(m[1])+"&username="+user+"&password="+url.QueryEscape(password))
}

// TestBadTextInBodies sends NUL characters (JSON "\u0000", which
// PostgreSQL refuses in text and jsonb), raw invalid UTF-8 and lone
// surrogates in every JSON member that can reach the database: NUL and
// invalid UTF-8 are refused with 400 before anything is stored, and nothing
// answers 500.
func TestBadTextInBodies(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{})
	pep := api{t: t, base: env.URL, token: dev.PEPToken}
	itsm := api{t: t, base: env.URL, token: dev.ITSMToken}
	ok := wireCall(50000)
	r := pep.do("POST", "/access/v1/requests", submission(t, ok, pep.do("POST", "/access/v1/evaluation", ok).json(t)))
	require.Equal(t, 202, r.status)
	id := r.json(t)["task"].(map[string]any)["id"].(string)

	// with marshals v and puts bad (raw JSON text) where MARK is.
	with := func(v any, bad string) []byte {
		b, err := json.Marshal(v)
		require.NoError(t, err)
		return bytes.ReplaceAll(b, []byte("MARK"), []byte(bad))
	}
	fresh := func() map[string]any { return submission(t, ok, pep.do("POST", "/access/v1/evaluation", ok).json(t)) }
	for _, tc := range []struct {
		bad     string
		refused bool // 400; otherwise anything but a 5xx
	}{
		{`\u0000`, true}, {`a\u0000b`, true}, {`\u0000\u0000`, true}, {"\xff", true}, {"a\xc0\xafb", true},
		{`\ud800`, false}, {`\udfff\ud800x`, false}, {`\\u0000`, false},
	} {
		check := func(what string, r reply) {
			t.Helper()
			if tc.refused {
				if r.header.Get("Content-Type") == "text/plain; charset=utf-8" {
					require.Equal(t, 400, r.status, "%s with %q: %s", what, tc.bad, r.body) // AuthZEN evaluation
				} else {
					r.problem(t, 400, authzen.ProblemInvalidRequest)
				}
			} else {
				require.Less(t, r.status, 500, "%s with %q: %s", what, tc.bad, r.body)
			}
		}
		call := wireCall(60000)
		call["resource"].(map[string]any)["properties"].(map[string]any)["arguments"].(map[string]any)["to"] = "acctMARK"
		check("evaluation argument", pep.do("POST", "/access/v1/evaluation", with(call, tc.bad)))
		call["subject"].(map[string]any)["id"] = "aliceMARK"
		check("evaluation subject", pep.do("POST", "/access/v1/evaluation", with(call, tc.bad)))
		check("batch evaluation", pep.do("POST", "/access/v1/evaluations", with(map[string]any{"evaluations": []any{call}}, tc.bad)))

		before := countRequests(t, env)
		for _, member := range []string{"context", "callback", "argument", "member name"} {
			sub := fresh()
			switch member {
			case "context":
				sub["context"] = map[string]any{"note": "xMARK"}
			case "callback":
				sub["callback"] = map[string]any{"endpoint": "https://pep.example/cb", "state": "sMARK"}
			case "argument":
				sub["resource"].(map[string]any)["properties"].(map[string]any)["arguments"].(map[string]any)["to"] = "acctMARK"
			default:
				sub["context"] = map[string]any{"noteMARK": "x"}
			}
			check("submission "+member, pep.do("POST", "/access/v1/requests", with(sub, tc.bad)))
		}
		if tc.refused {
			require.Equal(t, before, countRequests(t, env), "nothing is created")
		}

		check("cancellation comment", pep.do("POST", "/access/v1/requests/"+id+"/cancel", with(map[string]any{"comment": "xMARK"}, tc.bad)))
		check("decision reason", itsm.do("POST", "/v1/requests/"+id+"/decisions", with(map[string]any{"decision": "deny", "reason": "xMARK"}, tc.bad)))
		check("revocation reason", itsm.do("POST", "/v1/approvals/"+id+"/revoke", with(map[string]any{"reason": "xMARK"}, tc.bad)))
	}
	pep.do("POST", "/access/v1/requests", fresh(), "Idempotency-Key", "k\xff\xfe").problem(t, 400, authzen.ProblemInvalidIdempotencyKey)
	// A backslash before "u0000" is text, not a NUL.
	sub := fresh()
	sub["context"] = map[string]any{"note": `C:\u0000`}
	r = pep.do("POST", "/access/v1/requests", sub)
	require.Equal(t, 202, r.status, "%s", r.body)

	// The web UI's decision form: a NUL or invalid UTF-8 in the reason is
	// refused with a message, and the vote is not recorded.
	id2 := env.Submit(t, wireCall(70000))
	b := newUIBrowser(t, env.URL)
	b.signIn()
	for _, reason := range []string{"x%00", "%ff"} {
		p := b.post("/ui/requests/"+id2+"/decide", "decision=approve&reason="+reason+"&csrf="+url.QueryEscape(b.csrf))
		require.Equal(t, 400, p.status, "%s", p.body)
		require.Contains(t, p.body, "Your decision was not recorded")
	}
	got, err := env.Backend.Requests().Load(context.Background(), id2)
	require.NoError(t, err)
	require.Equal(t, "pending", string(got.Status))
}

func countRequests(t *testing.T, env *backendtest.Env) int {
	var n int
	require.NoError(t, env.Pool.QueryRow(context.Background(), "SELECT count(*) FROM arap.requests").Scan(&n))
	return n
}
