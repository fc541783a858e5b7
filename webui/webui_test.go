package webui_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/internal/visible"
	"github.com/omcp/arap/requests"
)

// browser is a cookie-keeping HTTP client that does not follow redirects,
// so tests see where each answer sends the person.
type browser struct {
	t    *testing.T
	base string
	c    *http.Client
}

func newBrowser(t *testing.T, base string) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, base: base, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

type page struct {
	status   int
	body     string
	location string
	header   http.Header
}

func (b *browser) get(path string, headers ...string) page {
	b.t.Helper()
	req, err := http.NewRequest("GET", b.base+path, nil)
	require.NoError(b.t, err)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return b.do(req)
}

func (b *browser) post(path string, form url.Values, headers ...string) page {
	b.t.Helper()
	req, err := http.NewRequest("POST", b.base+path, strings.NewReader(form.Encode()))
	require.NoError(b.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return b.do(req)
}

func (b *browser) do(req *http.Request) page {
	resp, err := b.c.Do(req)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return page{status: resp.StatusCode, body: string(body), location: resp.Header.Get("Location"), header: resp.Header}
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func csrf(t *testing.T, p page) string {
	t.Helper()
	m := csrfField.FindStringSubmatch(p.body)
	require.NotNil(t, m, "no CSRF token in page:\n%s", p.body)
	return m[1]
}

// signIn signs in through the login form.
func (b *browser) signIn(user, password string) page {
	b.t.Helper()
	login := b.get("/ui/login")
	require.Equal(b.t, 200, login.status)
	return b.post("/ui/login", url.Values{"csrf": {csrf(b.t, login)}, "username": {user}, "password": {password}, "next": {"/ui/"}})
}

func wireCall(subject string, amount float64) map[string]any {
	return map[string]any{
		"subject":  map[string]any{"type": "user", "id": subject, "properties": map[string]any{"act": map[string]any{"sub": "agent:demo"}}},
		"action":   map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": "wire_transfer", "properties": map[string]any{"arguments": map[string]any{"to": "acct-991", "amount": amount}}},
	}
}

func TestSignInSessionAndThrottle(t *testing.T) {
	clock := newClock()
	env := backendtest.Start(t, backendtest.Options{Now: clock.Now})
	b := newBrowser(t, env.URL)

	p := b.get("/ui/requests/anything")
	require.Equal(t, http.StatusSeeOther, p.status, "pages need a session")
	require.Equal(t, "/ui/login?next=%2Fui%2Frequests%2Fanything", p.location)

	login := b.get("/ui/login")
	require.Contains(t, login.header.Get("Content-Security-Policy"), "default-src 'self'")
	require.Equal(t, "DENY", login.header.Get("X-Frame-Options"))
	require.Contains(t, login.body, `<label for="username">`, "inputs are labelled")

	// No token, a wrong token, or a foreign Origin: refused before any password check.
	form := url.Values{"username": {"bob"}, "password": {dev.Password}}
	require.Equal(t, 403, b.post("/ui/login", form).status)
	form.Set("csrf", "forged")
	require.Equal(t, 403, b.post("/ui/login", form).status)
	form.Set("csrf", csrf(t, login))
	require.Equal(t, 403, b.post("/ui/login", form, "Origin", "https://evil.example").status)

	// Wrong passwords: a generic message; after the free attempts the
	// client must wait before the next one, which is refused unchecked even
	// with the right password; other accounts are unaffected.
	for i := 0; i < 3; i++ {
		p := b.signIn("carol", "wrong")
		require.Equal(t, 401, p.status)
		require.Contains(t, p.body, "Wrong user name or password.")
		require.NotContains(t, p.body, "Wait")
	}
	p = b.signIn("carol", "wrong")
	require.Equal(t, 401, p.status)
	require.Contains(t, p.body, "Wrong user name or password. Wait 1 second before trying again.")
	p = b.signIn("carol", dev.Password)
	require.Equal(t, http.StatusTooManyRequests, p.status)
	require.Equal(t, "1", p.header.Get("Retry-After"))
	require.Contains(t, p.body, "Too many failed sign-ins for this account from here; try again in 1 second.")
	clock.Advance(time.Second)
	p = b.signIn("carol", dev.Password)
	require.Equal(t, http.StatusSeeOther, p.status, "after the wait, the right password works: %s", p.body)
	b = newBrowser(t, env.URL)

	p = b.signIn("bob", dev.Password)
	require.Equal(t, http.StatusSeeOther, p.status, "%s", p.body)
	require.Equal(t, "/ui/", p.location)
	var cookie *http.Cookie
	for _, c := range b.c.Jar.Cookies(mustURL(t, env.URL+"/ui/")) {
		if c.Name == "arap_session" {
			cookie = c
		}
	}
	require.NotNil(t, cookie)
	set := p.header.Values("Set-Cookie")
	require.True(t, strings.Contains(strings.Join(set, "\n"), "HttpOnly") && strings.Contains(strings.Join(set, "\n"), "SameSite=Strict"), "%v", set)
	var stored int
	require.NoError(t, env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM arap.ui_sessions WHERE id_hash = sha256($1::bytea)`, []byte(cookie.Value)).Scan(&stored))
	require.Equal(t, 1, stored, "only the session id's hash is stored")

	queue := b.get("/ui/")
	require.Equal(t, 200, queue.status)
	require.Contains(t, queue.body, "Nothing is waiting for you.")

	// Sign-out needs the token; afterwards the old cookie is worthless.
	require.Equal(t, 403, b.post("/ui/logout", url.Values{}).status)
	require.Equal(t, http.StatusSeeOther, b.post("/ui/logout", url.Values{"csrf": {csrf(t, queue)}}).status)
	replay := newBrowser(t, env.URL)
	replay.c.Jar.SetCookies(mustURL(t, env.URL+"/ui/"), []*http.Cookie{{Name: "arap_session", Value: cookie.Value}})
	require.Equal(t, http.StatusSeeOther, replay.get("/ui/").status)

	// Redirect targets stay inside the UI.
	login = b.get("/ui/login")
	p = b.post("/ui/login", url.Values{"csrf": {csrf(t, login)}, "username": {"bob"}, "password": {dev.Password}, "next": {"//evil.example/ui/"}})
	require.Equal(t, "/ui/", p.location)
}

func TestQueueRequestPageAndDecision(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{})
	id := env.Submit(t, wireCall("alice", 50000))
	other := env.Submit(t, wireCall("dave", 70000))

	bob := newBrowser(t, env.URL)
	require.Equal(t, http.StatusSeeOther, bob.signIn("bob", dev.Password).status)
	queue := bob.get("/ui/")
	require.Equal(t, 200, queue.status)
	require.Contains(t, queue.body, `data-request="`+id+`"`)
	require.Contains(t, queue.body, `data-request="`+other+`"`)
	require.Less(t, strings.Index(queue.body, other), strings.Index(queue.body, id), "newest first")
	require.Contains(t, bob.get("/ui/?rule=wire_transfer_large").body, id)
	require.NotContains(t, bob.get("/ui/?rule=delete_repository").body, id, "filter by rule")

	// The live refresh asks for the main section only.
	partial := bob.get("/ui/", "X-Partial", "1")
	require.Equal(t, 200, partial.status)
	require.NotContains(t, partial.body, "<html")
	require.Contains(t, partial.body, id)

	// The request page says what is asked, in plain words.
	p := bob.get("/ui/requests/" + id)
	require.Equal(t, 200, p.status)
	for _, want := range []string{"wire_transfer", "50,000", "acct-991", "user alice", "agent:demo", "wire_transfer_large",
		"Transfers over $25,000 require approval", "0 of 1 approvals", "left (expires", "request.submitted", `id="approve"`, `id="deny"`} {
		require.Contains(t, p.body, want)
	}

	// A decision without the form's token, or from another origin, is
	// refused and changes nothing.
	require.Equal(t, 403, bob.post("/ui/requests/"+id+"/decide", url.Values{"decision": {"approve"}}).status)
	require.Equal(t, 403, bob.post("/ui/requests/"+id+"/decide", url.Values{"decision": {"approve"}, "csrf": {csrf(t, p)}}, "Origin", "http://evil.example").status)
	require.Equal(t, 403, bob.post("/ui/requests/"+id+"/decide", url.Values{"decision": {"approve"}, "csrf": {csrf(t, p)}}, "Sec-Fetch-Site", "cross-site").status)
	require.Equal(t, 400, bob.post("/ui/requests/"+id+"/decide", url.Values{"decision": {"maybe"}, "csrf": {csrf(t, p)}}).status)
	got, err := env.Backend.Requests().Load(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, requests.Pending, got.Status)

	d := bob.post("/ui/requests/"+id+"/decide", url.Values{"decision": {"approve"}, "reason": {"invoice 7731 checked"}, "csrf": {csrf(t, p)}})
	require.Equal(t, http.StatusSeeOther, d.status, "%s", d.body)
	require.Equal(t, "/ui/?done=approve", d.location)
	require.Contains(t, bob.get(d.location).body, "Your approval was recorded.")
	got, err = env.Backend.Requests().Load(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, requests.Approved, got.Status)

	p = bob.get("/ui/requests/" + id)
	require.Contains(t, p.body, "invoice 7731 checked")
	require.Contains(t, p.body, "user:bob")
	require.NotContains(t, p.body, `id="approve"`, "decided: no buttons")
	require.Contains(t, p.body, "already approved")

	// A second vote on a closed request: a clear message, nothing changes.
	again := bob.post("/ui/requests/"+id+"/decide", url.Values{"decision": {"deny"}, "csrf": {csrf(t, p)}})
	require.Equal(t, 409, again.status)
	require.Contains(t, again.body, "Your decision was not recorded")

	hist := bob.get("/ui/history")
	require.Contains(t, hist.body, id)
	require.Contains(t, hist.body, "invoice")
	require.NotContains(t, hist.body, other, "history holds ended requests only")
}

func TestIneligibleApproverSeesWhyAndNoButtons(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{})
	own := env.Submit(t, wireCall("bob", 50000))
	platform := env.Submit(t, map[string]any{
		"subject":  map[string]any{"type": "user", "id": "alice"},
		"action":   map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": "delete_repository", "properties": map[string]any{"arguments": map[string]any{"repository": "acme/legacy"}}},
	})

	bob := newBrowser(t, env.URL)
	require.Equal(t, http.StatusSeeOther, bob.signIn("bob", dev.Password).status)
	require.NotContains(t, bob.get("/ui/").body, own, "the default queue lists only what bob may decide")
	all := bob.get("/ui/?show=all")
	require.Contains(t, all.body, own)
	require.Contains(t, all.body, "You cannot decide this")

	p := bob.get("/ui/requests/" + own)
	require.Equal(t, 200, p.status)
	require.Contains(t, p.body, `id="why-not"`)
	require.Contains(t, p.body, "made on their behalf or through them")
	require.NotContains(t, p.body, `id="decide-form"`)
	require.NotContains(t, p.body, `id="approve"`)

	// Posting anyway is refused by the same rules the API applies.
	r := bob.post("/ui/requests/"+own+"/decide", url.Values{"decision": {"approve"}, "csrf": {csrf(t, p)}})
	require.Equal(t, 409, r.status)
	require.Contains(t, r.body, "made on their behalf")
	got, err := env.Backend.Requests().Load(context.Background(), own)
	require.NoError(t, err)
	require.Equal(t, requests.Pending, got.Status)

	// A request bob is not named for does not exist as far as he can tell.
	nf := bob.get("/ui/requests/" + platform)
	require.Equal(t, 404, nf.status)
	require.NotContains(t, nf.body, "acme/legacy")
	require.Equal(t, 404, bob.post("/ui/requests/"+platform+"/decide", url.Values{"decision": {"approve"}, "csrf": {csrf(t, p)}}).status)
	got, err = env.Backend.Requests().Load(context.Background(), platform)
	require.NoError(t, err)
	require.Equal(t, requests.Pending, got.Status)
}

// clock is a test clock for the web UI: time stands still until moved.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Now()} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func mustURL(t *testing.T, s string) *url.URL {
	u, err := url.Parse(s)
	require.NoError(t, err)
	return u
}

const displayPolicy = `version: 1
rules:
  - name: expense
    match: {resource_id: expense}
    effect: request
    display: {title: Expense approval, description: Expenses need one treasury approval.}
    approval: {groups: [treasury], kinds: [itsm]}
    request_schema:
      type: object
      properties:
        context:
          type: object
          properties:
            ticket: {type: string}
`

// rawHidden lists the characters of a page a person could not see or could
// mistake, outside the template's own line breaks.
func rawHidden(page string) []string {
	var out []string
	for _, f := range visible.Scan(page, true) {
		out = append(out, f.Label())
	}
	return out
}

// TestRequestPageMarksHiddenCharactersAndLabelsSources: the request page
// warns at the top and lists the exact code points; values show markers, and
// no hidden character reaches the page raw; what the requester stated is
// labelled so and kept apart from policy, with unasked context folded away.
func TestRequestPageMarksHiddenCharactersAndLabelsSources(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{Policy: []byte(displayPolicy)})
	id := env.Submit(t, map[string]any{
		"subject": map[string]any{"type": "user", "id": "alice"},
		"action":  map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": "expense", "properties": map[string]any{"arguments": map[string]any{
			"to": "acct-\u202e199\u202c", "n\u200bote": "<script>alert(1)</script>", "payee": "p\u0430ypal", "nested": map[string]any{"k": "v\u2066"}}}},
		"context": map[string]any{"ticket": "CHG-7", "approved_by": "CFO"},
	})
	clean := env.Submit(t, map[string]any{
		"subject":  map[string]any{"type": "user", "id": "alice"},
		"action":   map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": "expense", "properties": map[string]any{"arguments": map[string]any{"to": "acct-991"}}},
	})
	bob := newBrowser(t, env.URL)
	require.Equal(t, http.StatusSeeOther, bob.signIn("bob", dev.Password).status)

	p := bob.get("/ui/requests/" + id)
	require.Equal(t, 200, p.status)
	require.Empty(t, rawHidden(p.body), "no hidden character reaches the page")
	warning := p.body[strings.Index(p.body, `id="hidden-warning"`):strings.Index(p.body, "<h1>")]
	for _, code := range []string{"U+202E</mark> <span class=\"code-name\">RIGHT-TO-LEFT OVERRIDE</span> (bidirectional formatting) in <bdi class=\"val\">argument “to”</bdi>", "U+202C", "U+200B", "U+0430", "U+2066"} {
		require.Contains(t, warning, code)
	}
	require.Contains(t, warning, `in <bdi class="val">argument “n<mark class="hidden-char"`, "the place is named, marked too")
	require.Contains(t, p.body, `<bdi class="val">acct-<mark class="hidden-char" title="U+202E RIGHT-TO-LEFT OVERRIDE: bidirectional formatting">U+202E</mark>199<mark class="hidden-char" title="U+202C POP DIRECTIONAL FORMATTING: bidirectional formatting">U+202C</mark></bdi>`)
	require.Contains(t, p.body, `<dt><bdi class="val">n<mark class="hidden-char" title="U+200B ZERO WIDTH SPACE: invisible character">U+200B</mark>ote</bdi></dt>`, "argument names are marked")
	require.Contains(t, p.body, "&lt;script&gt;alert(1)&lt;/script&gt;")
	require.NotContains(t, p.body, "<script>alert")
	require.Less(t, strings.Index(p.body, `id="hidden-warning"`), strings.Index(p.body, `id="args-h"`), "the warning comes first")

	// Who said what.
	answers := p.body[strings.Index(p.body, `id="answers"`):]
	answers = answers[:strings.Index(answers, "</section>")]
	require.Contains(t, answers, "The requester's answers")
	require.Contains(t, answers, "Stated by the requester")
	require.Contains(t, answers, "CHG-7")
	require.NotContains(t, answers, "approved_by")
	extra := p.body[strings.Index(p.body, `<details class="card extra" id="extra-context">`):]
	extra = extra[:strings.Index(extra, "</details>")]
	require.Contains(t, extra, "<summary>Extra, not asked for, not checked (1)</summary>")
	require.Contains(t, extra, "approved_by")
	require.Contains(t, extra, "CFO")
	require.NotContains(t, extra, " open", "folded away")
	policy := p.body[strings.Index(p.body, `class="card from-policy"`):]
	policy = policy[:strings.Index(policy, "</section>")]
	require.Contains(t, policy, "From policy, not from the requester.")
	require.Contains(t, policy, "Expenses need one treasury approval.")
	require.NotContains(t, policy, "CFO")
	args := p.body[strings.Index(p.body, `id="args-h"`):]
	require.Contains(t, args[:strings.Index(args, "</section>")], "Stated by the requester")

	// The queue and the history flag it; a clean request has no warning.
	queue := bob.get("/ui/")
	require.Empty(t, rawHidden(queue.body))
	row := queue.body[strings.Index(queue.body, `data-request="`+id+`"`):]
	require.Contains(t, row[:strings.Index(row, "</li>")], "hidden-badge")
	row = queue.body[strings.Index(queue.body, `data-request="`+clean+`"`):]
	require.NotContains(t, row[:strings.Index(row, "</li>")], "hidden-badge")
	require.NotContains(t, bob.get("/ui/requests/"+clean).body, `id="hidden-warning"`)

	d := bob.post("/ui/requests/"+id+"/decide", url.Values{"decision": {"deny"}, "reason": {"looks \u202eodd"}, "csrf": {csrf(t, p)}})
	require.Equal(t, http.StatusSeeOther, d.status, "%s", d.body)
	hist := bob.get("/ui/history")
	require.Empty(t, rawHidden(hist.body))
	require.Contains(t, hist.body, "hidden-badge")
	require.Contains(t, hist.body, `looks <mark class="hidden-char"`, "vote reasons are marked")
	p = bob.get("/ui/requests/" + id)
	require.Empty(t, rawHidden(p.body), "votes and the audit trail are marked too")
	require.Contains(t, p.body, "in <bdi class=\"val\">the reason of user:bob</bdi>")
}

// TestCompatibilityCharactersMarked (issue 39): an argument written in
// fullwidth forms ("ｃ－１２３") is marked character by character in the
// queue row, on the request page and in the history, with the warning at
// the top listing each code point, while ordinary Japanese and accented
// text beside it is shown as it is.
func TestCompatibilityCharactersMarked(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{Policy: []byte(displayPolicy)})
	id := env.Submit(t, map[string]any{
		"subject": map[string]any{"type": "user", "id": "alice"},
		"action":  map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": "expense", "properties": map[string]any{"arguments": map[string]any{
			"to": "\uff43\uff0d\uff11\uff12\uff13", "memo": "東京タワー、Zürich café"}}},
	})
	bob := newBrowser(t, env.URL)
	require.Equal(t, http.StatusSeeOther, bob.signIn("bob", dev.Password).status)
	const fullwidth = `<bdi class="val"><mark class="hidden-char" title="U+FF43 FULLWIDTH LATIN SMALL LETTER C (NFKC “c”): compatibility character">U+FF43</mark>` +
		`<mark class="hidden-char" title="U+FF0D FULLWIDTH HYPHEN-MINUS (NFKC “-”): compatibility character">U+FF0D</mark>` +
		`<mark class="hidden-char" title="U+FF11 FULLWIDTH DIGIT ONE (NFKC “1”): compatibility character">U+FF11</mark>` +
		`<mark class="hidden-char" title="U+FF12 FULLWIDTH DIGIT TWO (NFKC “2”): compatibility character">U+FF12</mark>` +
		`<mark class="hidden-char" title="U+FF13 FULLWIDTH DIGIT THREE (NFKC “3”): compatibility character">U+FF13</mark></bdi>`
	const memo = `<bdi class="val">東京タワー、Zürich café</bdi>`

	p := bob.get("/ui/requests/" + id)
	require.Equal(t, 200, p.status)
	require.Empty(t, rawHidden(p.body), "no compatibility character reaches the page")
	require.Contains(t, p.body, `id="hidden-warning"`)
	warning := p.body[strings.Index(p.body, `id="hidden-warning"`):strings.Index(p.body, "<h1>")]
	for _, c := range []string{"U+FF43</mark> <span class=\"code-name\">FULLWIDTH LATIN SMALL LETTER C (NFKC “c”)</span> (compatibility character) in <bdi class=\"val\">argument “to”</bdi>",
		"U+FF0D", "U+FF11", "U+FF12", "U+FF13"} {
		require.Contains(t, warning, c)
	}
	require.NotContains(t, warning, "memo", "ordinary text is no finding")
	require.Contains(t, p.body, "<dd>"+fullwidth+"</dd>")
	require.Contains(t, p.body, "<dd>"+memo+"</dd>")

	queue := bob.get("/ui/")
	require.Empty(t, rawHidden(queue.body))
	row := queue.body[strings.Index(queue.body, `data-request="`+id+`"`):]
	row = row[:strings.Index(row, "</li>")]
	require.Contains(t, row, "hidden-badge")
	require.Contains(t, row, fullwidth)
	require.Contains(t, row, `data-live-text="New request: expense for user alice, memo 東京タワー、Zürich café, to &lt;U&#43;FF43&gt;&lt;U&#43;FF0D&gt;&lt;U&#43;FF11&gt;&lt;U&#43;FF12&gt;&lt;U&#43;FF13&gt;"`)

	require.Equal(t, http.StatusSeeOther, bob.post("/ui/requests/"+id+"/decide", url.Values{"decision": {"deny"}, "csrf": {csrf(t, p)}}).status)
	hist := bob.get("/ui/history")
	require.Empty(t, rawHidden(hist.body))
	require.Contains(t, hist.body, "hidden-badge")
	require.Contains(t, hist.body, fullwidth)
	require.Contains(t, hist.body, memo)
}

// channelPolicy: repository deletion is decided in the web UI only;
// deployments only through a client on a person's behalf. An ITSM client
// is named in both, so only the channel refuses it.
const channelPolicy = `version: 1
rules:
  - name: web_only
    match: {resource_id: delete_repository}
    effect: request
    approval:
      groups: [platform]
      kinds: [itsm]
      channels: [web]
  - name: on_behalf_only
    match: {resource_id: deploy_service}
    effect: request
    approval:
      groups: [platform]
      kinds: [itsm]
      channels: [on_behalf]
`

// decideByAPI posts a decision as the dev ITSM client, on person's behalf
// unless person is empty, and returns the status and body.
func decideByAPI(t *testing.T, base, id, person string) (int, map[string]any) {
	t.Helper()
	body := map[string]any{"decision": "approve"}
	if person != "" {
		body["on_behalf_of"] = person
	}
	b, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequest("POST", base+"/v1/requests/"+id+"/decisions", bytes.NewReader(b))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+dev.ITSMToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out
}

// TestDecisionChannels: a rule's approval.channels refuses the decision API
// (as itself or on a person's behalf) where only the web UI may decide, and
// the web UI where only on-behalf decisions may; each refusal says why and
// records nothing, and the allowed channel still works. A vote recorded on a
// person's behalf shows as theirs, via the client.
func TestDecisionChannels(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{Policy: []byte(channelPolicy)})
	ctx := context.Background()
	call := func(tool string, args map[string]any) map[string]any {
		return map[string]any{
			"subject":  map[string]any{"type": "user", "id": "alice"},
			"action":   map[string]any{"name": "tools/call"},
			"resource": map[string]any{"type": "mcp_tool", "id": tool, "properties": map[string]any{"arguments": args}},
		}
	}
	webOnly := env.Submit(t, call("delete_repository", map[string]any{"repository": "acme/legacy"}))
	behalfOnly := env.Submit(t, call("deploy_service", map[string]any{"service": "api", "version": "2"}))
	noVotes := func(id string) {
		t.Helper()
		votes, err := env.Backend.Requests().Votes(ctx, id)
		require.NoError(t, err)
		require.Empty(t, votes)
		got, err := env.Backend.Requests().Load(ctx, id)
		require.NoError(t, err)
		require.Equal(t, requests.Pending, got.Status)
	}

	// Web only: the API is refused, as the client and for dave.
	for _, person := range []string{"", "dave"} {
		status, p := decideByAPI(t, env.URL, webOnly, person)
		require.Equal(t, 403, status, "%v", p)
		require.Equal(t, authzen.ProblemType(authzen.ProblemChannelNotAllowed), p["type"])
		require.Contains(t, p["detail"], "only through the web UI (web)")
	}
	noVotes(webOnly)

	// On behalf only: the client as itself is refused, and so is dave in
	// the web UI, with the reason on the page.
	status, p := decideByAPI(t, env.URL, behalfOnly, "")
	require.Equal(t, 403, status, "%v", p)
	require.Equal(t, authzen.ProblemType(authzen.ProblemChannelNotAllowed), p["type"])
	dave := newBrowser(t, env.URL)
	require.Equal(t, http.StatusSeeOther, dave.signIn("dave", dev.Password).status)
	page := dave.get("/ui/requests/" + behalfOnly)
	require.Equal(t, 200, page.status)
	require.Contains(t, page.body, `id="why-not"`)
	require.Contains(t, page.body, "takes decisions only through an API client deciding for a person (on_behalf)")
	require.NotContains(t, page.body, `id="approve"`)
	refused := dave.post("/ui/requests/"+behalfOnly+"/decide", url.Values{"decision": {"approve"}, "csrf": {csrf(t, page)}})
	require.Equal(t, 403, refused.status)
	require.Contains(t, refused.body, "Your decision was not recorded: rule on_behalf_only takes decisions only through")
	noVotes(behalfOnly)

	// The allowed channels: dave in the web UI; dave through the client.
	page = dave.get("/ui/requests/" + webOnly)
	require.Contains(t, page.body, `id="approve"`)
	d := dave.post("/ui/requests/"+webOnly+"/decide", url.Values{"decision": {"approve"}, "csrf": {csrf(t, page)}})
	require.Equal(t, http.StatusSeeOther, d.status, "%s", d.body)
	got, err := env.Backend.Requests().Load(ctx, webOnly)
	require.NoError(t, err)
	require.Equal(t, requests.Approved, got.Status)
	votes, err := env.Backend.Requests().Votes(ctx, webOnly)
	require.NoError(t, err)
	require.Equal(t, "web", votes[0].Channel)
	require.Nil(t, votes[0].Via)

	status, p = decideByAPI(t, env.URL, behalfOnly, "dave")
	require.Equal(t, 200, status, "%v", p)
	require.Equal(t, "approved", p["status"])
	page = dave.get("/ui/requests/" + behalfOnly)
	require.Contains(t, page.body, `by <strong><bdi class="val">user:dave</bdi></strong> (human) <span class="via">via <bdi class="val">dev-itsm</bdi> (itsm)</span>`)
	require.Contains(t, page.body, "via_client: dev-itsm", "the audit trail names the client too")
	require.Contains(t, dave.get("/ui/history").body, `<bdi class="val">user:dave</bdi> via <bdi class="val">dev-itsm</bdi>: approve`)
}

// TestFourEyesPageNamesWhoAndWhere: the request page names the submitting
// API client as the audit trail does (its name, not only its cli_ id) and,
// for a gateway tool, the upstream server and the tool's name there; the
// first of two approvers lands back on the request at "1 of 2", not on an
// empty queue, and the second on the queue.
func TestFourEyesPageNamesWhoAndWhere(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{})
	id := env.Submit(t, map[string]any{
		"subject": map[string]any{"type": "user", "id": "alice"},
		"action":  map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": "delete_repository", "properties": map[string]any{
			"upstream": "github", "upstream_tool": "delete_repo", "arguments": map[string]any{"repo": "acme/legacy"}}},
	})
	req, err := env.Backend.Requests().Load(context.Background(), id)
	require.NoError(t, err)

	dave := newBrowser(t, env.URL)
	require.Equal(t, http.StatusSeeOther, dave.signIn("dave", dev.Password).status)
	p := dave.get("/ui/requests/" + id)
	require.Equal(t, 200, p.status)
	require.Contains(t, p.body, `Submitted by API client <strong><bdi class="val">dev-pep</bdi></strong> (<bdi class="val">`+req.ClientID+`</bdi>)`)
	require.Contains(t, p.body, `<code id="upstream-tool"><bdi class="val">delete_repo</bdi></code> on the upstream server <strong id="upstream"><bdi class="val">github</bdi></strong>`)

	d := dave.post("/ui/requests/"+id+"/decide", url.Values{"decision": {"approve"}, "csrf": {csrf(t, p)}})
	require.Equal(t, http.StatusSeeOther, d.status, "%s", d.body)
	require.Equal(t, "/ui/requests/"+id+"?done=approve", d.location)
	back := dave.get(d.location)
	require.Contains(t, back.body, "Your approval was recorded: 1 of 2. The call runs when the rest are given.")
	require.Contains(t, back.body, "1 of 2 approvals")

	erin := newBrowser(t, env.URL)
	require.Equal(t, http.StatusSeeOther, erin.signIn("erin", dev.Password).status)
	p = erin.get("/ui/requests/" + id)
	d = erin.post("/ui/requests/"+id+"/decide", url.Values{"decision": {"approve"}, "csrf": {csrf(t, p)}})
	require.Equal(t, "/ui/?done=approve", d.location, "the last approval ends the request: back to the queue")
}
