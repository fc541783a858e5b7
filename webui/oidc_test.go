package webui_test

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/backend"
	"github.com/omcp/arap/directory"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/internal/oidctest"
	"github.com/omcp/arap/sso"
)

// ssoEnv is a backend whose web UI signs in through a real OpenID provider
// on loopback.
type ssoEnv struct {
	*backendtest.Env
	op *oidctest.OP
}

func startSSO(t *testing.T, noPasswords bool) *ssoEnv {
	t.Helper()
	op := oidctest.Start(t)
	env := backendtest.Start(t, backendtest.Options{NoLocalPasswords: noPasswords, OIDC: &sso.Config{
		Issuer: op.Issuer, ClientID: oidctest.ClientID, ClientSecret: oidctest.ClientSecret,
		GroupsClaim: oidctest.GroupsClaim, Name: "Test IdP",
	}})
	op.AllowRedirect(env.URL + "/ui/oidc/callback")
	return &ssoEnv{Env: env, op: op}
}

// abs requests an absolute URL (ours or the provider's) without following
// redirects.
func (b *browser) abs(method, u string, form url.Values) page {
	b.t.Helper()
	var body *strings.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	} else {
		body = strings.NewReader("")
	}
	req, err := http.NewRequest(method, u, body)
	require.NoError(b.t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	return b.do(req)
}

// follow GETs u and follows redirects until an answer that is not one, or
// until stop says to stop at a redirect's target; it returns the last
// answer and the URL that gave it (or the target stop stopped at).
func (b *browser) follow(u string, stop func(*url.URL) bool) (page, string) {
	b.t.Helper()
	for range 20 {
		p := b.abs("GET", u, nil)
		if p.status < 300 || p.status >= 400 {
			return p, u
		}
		next, err := url.Parse(u)
		require.NoError(b.t, err)
		next, err = next.Parse(p.location)
		require.NoError(b.t, err)
		if stop != nil && stop(next) {
			return p, next.String()
		}
		u = next.String()
	}
	b.t.Fatal("too many redirects")
	return page{}, ""
}

var opRequestID = regexp.MustCompile(`name="id" value="([^"]+)"`)

// ssoLogin starts a sign-in at the login page's button and signs in at the
// provider's form; it returns the provider's answer (a redirect to the
// callback on success) and the callback URL it names ("" if none).
func (e *ssoEnv) ssoLogin(b *browser, username, password string) (page, string) {
	b.t.Helper()
	login := b.get("/ui/login")
	require.Equal(b.t, 200, login.status)
	require.Contains(b.t, login.body, `href="/ui/login/oidc?next=%2fui%2f"`)
	form, at := b.follow(e.URL+"/ui/login/oidc?next=/ui/", nil)
	require.Equal(b.t, 200, form.status, "%s: %s", at, form.body)
	require.True(b.t, strings.HasPrefix(at, e.op.Issuer), at)
	m := opRequestID.FindStringSubmatch(form.body)
	require.NotNil(b.t, m, form.body)
	p := b.abs("POST", e.op.Issuer+"/login/username", url.Values{"id": {m[1]}, "username": {username}, "password": {password}})
	if p.status != http.StatusFound {
		return p, ""
	}
	// The provider's callback, then its redirect to ours.
	next, err := url.Parse(e.op.Issuer + "/login/username")
	require.NoError(b.t, err)
	next, err = next.Parse(p.location)
	require.NoError(b.t, err)
	if strings.HasPrefix(next.String(), e.URL) {
		return p, next.String() // the provider answers at once (an error)
	}
	p, cb := b.follow(next.String(), func(u *url.URL) bool { return strings.HasPrefix(u.String(), e.URL) })
	require.True(b.t, strings.HasPrefix(cb, e.URL+"/ui/oidc/callback"), cb)
	return p, cb
}

// ssoSignIn signs in and returns the callback's answer.
func (e *ssoEnv) ssoSignIn(b *browser, username, password string) page {
	b.t.Helper()
	_, cb := e.ssoLogin(b, username, password)
	require.NotEmpty(b.t, cb, "the provider refused the sign-in")
	return b.abs("GET", cb, nil)
}

func signedIn(t *testing.T, p page) {
	t.Helper()
	require.Equal(t, 200, p.status, p.body)
	require.Contains(t, p.body, `<meta http-equiv="refresh" content="0; url=/ui/">`)
	require.Contains(t, strings.Join(p.header.Values("Set-Cookie"), "\n"), "arap_session=")
}

func refused(t *testing.T, p page, status int, msg string) {
	t.Helper()
	require.Equal(t, status, p.status, p.body)
	require.Contains(t, p.body, msg)
	require.NotContains(t, strings.Join(p.header.Values("Set-Cookie"), "\n"), "arap_session=")
}

var treasurer = oidctest.User{ID: "idp-sub-7", Username: "tess", Password: "op-password", GivenName: "Tess", FamilyName: "Ury",
	Email: "tess@corp.example", EmailVerified: true, Groups: []string{"treasury", "not-in-arap"}}

func TestOIDCSignInProvisionsAndSyncs(t *testing.T) {
	e := startSSO(t, false)
	ctx := context.Background()
	e.op.Put(treasurer)
	id := e.Submit(t, wireCall("alice", 50000))

	b := newBrowser(t, e.URL)
	p := e.ssoSignIn(b, "tess", "op-password")
	signedIn(t, p)
	u, err := e.Backend.Directory().User(ctx, "tess")
	require.NoError(t, err)
	require.Equal(t, "Tess Ury", u.DisplayName)
	require.Equal(t, "tess@corp.example", u.Email)
	require.Equal(t, []string{"treasury"}, u.Groups, "the claim's values naming directory groups")
	var iss, sub string
	require.NoError(t, e.Pool.QueryRow(ctx, `SELECT oidc_issuer, oidc_subject FROM arap.ui_sessions WHERE user_name = 'tess'`).Scan(&iss, &sub))
	require.Equal(t, e.op.Issuer, iss)
	require.Equal(t, "idp-sub-7", sub, "the session keeps the provider subject")

	queue := b.get("/ui/")
	require.Equal(t, 200, queue.status)
	require.Contains(t, queue.body, `data-request="`+id+`"`, "a treasury approver from the provider sees the request")

	// The provider renames her, changes her address, takes her out of treasury.
	e.op.Update("idp-sub-7", func(u *oidctest.User) {
		u.GivenName, u.Email, u.Groups = "Theresa", "theresa@corp.example", []string{"platform"}
	})
	b2 := newBrowser(t, e.URL)
	signedIn(t, e.ssoSignIn(b2, "tess", "op-password"))
	u, err = e.Backend.Directory().User(ctx, "tess")
	require.NoError(t, err)
	require.Equal(t, "Theresa Ury", u.DisplayName)
	require.Equal(t, "theresa@corp.example", u.Email)
	require.Equal(t, []string{"platform"}, u.Groups)
	queue = b2.get("/ui/")
	require.Equal(t, 200, queue.status)
	require.NotContains(t, queue.body, `data-request="`+id+`"`, "no longer a treasury approver")
	req := b2.get("/ui/requests/" + id)
	require.NotContains(t, req.body, `value="approve"`)

	// Back in treasury at the next sign-in.
	e.op.Update("idp-sub-7", func(u *oidctest.User) { u.Groups = []string{"treasury"} })
	b3 := newBrowser(t, e.URL)
	signedIn(t, e.ssoSignIn(b3, "tess", "op-password"))
	require.Contains(t, b3.get("/ui/").body, `data-request="`+id+`"`)

	// A flow is used once: replaying the callback is refused.
	// A flow is used once: replaying the callback, even with the flow
	// cookie put back, is refused.
	b4 := newBrowser(t, e.URL)
	_, cb := e.ssoLogin(b4, "tess", "op-password")
	var flow []*http.Cookie
	for _, c := range b4.c.Jar.Cookies(mustURL(t, cb)) {
		if c.Name == "arap_oidc_flow" {
			flow = append(flow, c)
		}
	}
	require.Len(t, flow, 1)
	signedIn(t, b4.abs("GET", cb, nil))
	b4.c.Jar.SetCookies(mustURL(t, e.URL+"/ui/oidc/"), flow)
	refused(t, b4.abs("GET", cb, nil), 400, "was already used")
}

func TestOIDCNameCollisionNeverTakesALocalAccount(t *testing.T) {
	e := startSSO(t, false)
	ctx := context.Background()
	// "bob" is a local treasury approver of the dev seed, with bob's address.
	e.op.Put(oidctest.User{ID: "someone-else", Username: "bob", Password: "op-password", GivenName: "Not", FamilyName: "Bob",
		Email: "bob@example.com", EmailVerified: true})
	b := newBrowser(t, e.URL)
	signedIn(t, e.ssoSignIn(b, "bob", "op-password"))
	u, err := e.Backend.Directory().User(ctx, "bob2")
	require.NoError(t, err)
	require.Equal(t, "Not Bob", u.DisplayName)
	require.Empty(t, u.Groups)
	bob, err := e.Backend.Directory().User(ctx, "bob")
	require.NoError(t, err)
	require.Equal(t, []string{"treasury"}, bob.Groups)
	require.NotEqual(t, "Not Bob", bob.DisplayName)
	var user string
	require.NoError(t, e.Pool.QueryRow(ctx, `SELECT user_name FROM arap.ui_sessions WHERE oidc_subject = 'someone-else'`).Scan(&user))
	require.Equal(t, "bob2", user)
}

func TestOIDCRefusesBadIDTokens(t *testing.T) {
	e := startSSO(t, false)
	e.op.Put(treasurer)
	for _, tc := range []struct {
		name   string
		faults oidctest.Faults
		msg    string
	}{
		{"wrong audience", oidctest.Faults{Audience: []string{"another-client"}}, sso.CheckAudience},
		{"wrong nonce", oidctest.Faults{Nonce: "a-nonce-from-another-sign-in"}, sso.CheckNonce},
		{"expired", oidctest.Faults{IDTokenLifetime: -time.Hour}, sso.CheckExpiry},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.op.SetFaults(tc.faults)
			defer e.op.SetFaults(oidctest.Faults{})
			b := newBrowser(t, e.URL)
			p := e.ssoSignIn(b, "tess", "op-password")
			refused(t, p, http.StatusUnauthorized, "Sign-in refused: "+escaped(tc.msg)+".")
			require.NotContains(t, p.body, "eyJ", "no token on the page")
			require.Equal(t, http.StatusSeeOther, b.get("/ui/").status, "no session")
		})
	}
	_, err := e.Backend.Directory().User(context.Background(), "tess")
	require.ErrorIs(t, err, directory.ErrNotFound, "no user from a refused token")
}

// escaped is s as html/template writes it.
func escaped(s string) string { return strings.ReplaceAll(s, "'", "&#39;") }

func TestOIDCUnverifiedEmailNotUsed(t *testing.T) {
	e := startSSO(t, false)
	// Claims alice's address, unverified.
	e.op.Put(oidctest.User{ID: "u-1", Username: "mallet", Password: "op-password", Email: "alice@example.com", EmailVerified: false})
	b := newBrowser(t, e.URL)
	p := e.ssoSignIn(b, "mallet", "op-password")
	require.Equal(t, 200, p.status, p.body)
	require.Contains(t, p.body, "Your identity provider has not verified your e-mail address, so arap does not use it")
	require.NotContains(t, p.body, "http-equiv", "the page waits for the notice to be read")
	require.Contains(t, p.body, `id="continue" href="/ui/"`)
	require.Equal(t, 200, b.get("/ui/").status, "signed in")
	u, err := e.Backend.Directory().User(context.Background(), "mallet")
	require.NoError(t, err)
	require.Empty(t, u.Email, "an unverified address is not stored, so not used for eligibility or notifications")
}

func TestOIDCStateAndFlow(t *testing.T) {
	e := startSSO(t, false)
	e.op.Put(treasurer)

	b := newBrowser(t, e.URL)
	_, cb := e.ssoLogin(b, "tess", "op-password")
	forged, err := url.Parse(cb)
	require.NoError(t, err)
	q := forged.Query()
	q.Set("state", "forged-state")
	forged.RawQuery = q.Encode()
	refused(t, b.abs("GET", forged.String(), nil), 400, "state mismatch")
	refused(t, b.abs("GET", cb, nil), 400, "already used") // the flow ended with the mismatch

	// A callback in a browser that never started the sign-in.
	b = newBrowser(t, e.URL)
	_, cb = e.ssoLogin(b, "tess", "op-password")
	other := newBrowser(t, e.URL)
	refused(t, other.abs("GET", cb, nil), 400, "not started in this browser")
}

func TestOIDCUserDisabledOrRemovedAtProvider(t *testing.T) {
	e := startSSO(t, false)
	e.op.Put(treasurer)
	signedIn(t, e.ssoSignIn(newBrowser(t, e.URL), "tess", "op-password"))

	e.op.Update("idp-sub-7", func(u *oidctest.User) { u.Disabled = true })
	b := newBrowser(t, e.URL)
	refused(t, e.ssoSignIn(b, "tess", "op-password"), http.StatusForbidden, "The provider refused the sign-in (access_denied)")
	require.Equal(t, http.StatusSeeOther, b.get("/ui/").status)

	e.op.Remove("idp-sub-7")
	b = newBrowser(t, e.URL)
	p, cb := e.ssoLogin(b, "tess", "op-password")
	require.Empty(t, cb, "the provider does not send a removed user back")
	require.Equal(t, http.StatusUnauthorized, p.status)
	require.Equal(t, http.StatusSeeOther, b.get("/ui/").status)
}

func TestOIDCUserDisabledInDirectory(t *testing.T) {
	e := startSSO(t, false)
	e.op.Put(treasurer)
	signedIn(t, e.ssoSignIn(newBrowser(t, e.URL), "tess", "op-password"))
	require.NoError(t, e.Backend.Directory().DisableUser(context.Background(), "tess", "admin"))
	b := newBrowser(t, e.URL)
	refused(t, e.ssoSignIn(b, "tess", "op-password"), http.StatusForbidden, "This account is disabled in arap.")
	require.Equal(t, http.StatusSeeOther, b.get("/ui/").status)
}

func TestOIDCLocalPasswordsOff(t *testing.T) {
	e := startSSO(t, true)
	b := newBrowser(t, e.URL)
	login := b.get("/ui/login")
	require.Equal(t, 200, login.status)
	require.Contains(t, login.body, "Sign in with Test IdP")
	require.NotContains(t, login.body, `name="password"`)
	before := e.Backend.Directory().PasswordChecks()
	p := b.post("/ui/login", url.Values{"username": {"bob"}, "password": {dev.Password}, "next": {"/ui/"}})
	refused(t, p, http.StatusForbidden, "Sign-in with a password is turned off here.")
	require.Equal(t, before, e.Backend.Directory().PasswordChecks(), "no password was checked")
	require.Equal(t, http.StatusSeeOther, b.get("/ui/").status)

	// Passwords on (the default): the form and the button.
	on := startSSO(t, false)
	login = newBrowser(t, on.URL).get("/ui/login")
	require.Contains(t, login.body, `name="password"`)
	require.Contains(t, login.body, "Sign in with Test IdP")
}

func TestOIDCMisconfiguredProviderStopsStart(t *testing.T) {
	op := oidctest.Start(t)
	dir := t.TempDir()
	policy := dir + "/policy.yaml"
	require.NoError(t, os.WriteFile(policy, dev.SeedPolicy(), 0o600))
	wrong := strings.Replace(op.Issuer, "127.0.0.1", "localhost", 1)
	_, err := backend.New(context.Background(), backend.Config{Addr: "127.0.0.1:0", DatabaseURL: dbtest.URL(t), PolicyFile: policy, MasterKey: make([]byte, 32),
		Migrate: true, OIDC: &sso.Config{Issuer: wrong, ClientID: oidctest.ClientID, ClientSecret: oidctest.ClientSecret}})
	require.ErrorContains(t, err, "sso: issuer "+wrong+": the discovery document names issuer \""+op.Issuer+"\"")

	_, err = backend.New(context.Background(), backend.Config{Addr: "127.0.0.1:0", DatabaseURL: dbtest.URL(t), PolicyFile: policy, MasterKey: make([]byte, 32),
		Migrate: true, NoLocalPasswords: true})
	require.ErrorContains(t, err, "with local passwords off, an OpenID provider is required")
}
