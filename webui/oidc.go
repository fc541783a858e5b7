package webui

import (
	"crypto/subtle"
	"errors"
	"html/template"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/oauth2"

	"github.com/omcp/arap/directory"
	"github.com/omcp/arap/sso"
)

// Sign-in through an OpenID provider: GET /ui/login/oidc stores the flow
// (state, nonce, PKCE verifier, where to go next) in arap.ui_oidc_flows
// under a random id held by the flow cookie, and sends the browser to the
// provider; GET /ui/oidc/callback takes the flow out (once), checks state,
// has package sso exchange the code and verify the ID token, has the
// directory create or update the user from the verified claims, and opens
// a session as a password sign-in does.
const (
	flowCookie = "arap_oidc_flow"
	flowTTL    = 10 * time.Minute
)

// flowCookieFor is the flow cookie: SameSite=Lax, because the callback is a
// cross-site top-level GET from the provider, on which Strict cookies are
// not sent; only the callback's path sees it.
func (u *UI) flowCookieFor(value string, maxAge int) *http.Cookie {
	return &http.Cookie{Name: flowCookie, Value: value, Path: "/ui/oidc/", MaxAge: maxAge, HttpOnly: true, Secure: u.d.Secure, SameSite: http.SameSiteLaxMode}
}

// loginData is what the sign-in page shows besides an error.
func (u *UI) loginData(next, username string) map[string]string {
	d := map[string]string{"Next": safeNext(next), "Username": username}
	if u.d.SSO != nil {
		d["SSO"] = u.d.SSO.Name()
	}
	if !u.d.DisablePasswords {
		d["Passwords"] = "on"
	}
	return d
}

// loginFailed renders the sign-in page with msg.
func (u *UI) loginFailed(w http.ResponseWriter, r *http.Request, status int, msg, next string) {
	token := randomToken()
	http.SetCookie(w, u.cookie(loginCSRFKey, token, 600))
	u.render(w, r, "login", status, page{Title: "Sign in", CSRF: token, Error: msg, Data: u.loginData(next, "")})
}

// passwordsOff refuses a password sign-in without looking at it.
func (u *UI) passwordsOff(w http.ResponseWriter, r *http.Request) {
	msg := "Sign-in with a password is turned off here."
	if u.d.SSO != nil {
		msg += " Use \"Sign in with " + u.d.SSO.Name() + "\"."
	}
	u.loginFailed(w, r, http.StatusForbidden, msg, r.PostFormValue("next"))
}

func (u *UI) oidcStart(w http.ResponseWriter, r *http.Request) {
	if u.d.SSO == nil {
		http.NotFound(w, r)
		return
	}
	id, state, nonce, verifier := randomToken(), randomToken(), randomToken(), oauth2.GenerateVerifier()
	next := safeNext(r.URL.Query().Get("next"))
	ctx := r.Context()
	if err := pgx.BeginFunc(ctx, u.d.DB, func(tx pgx.Tx) error {
		// Abandoned flows are swept here, like sessions at sign-in.
		if _, err := tx.Exec(ctx, `DELETE FROM arap.ui_oidc_flows WHERE expires_at < $1`, u.now()); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO arap.ui_oidc_flows (id_hash, state, nonce, verifier, next, expires_at) VALUES ($1, $2, $3, $4, $5, $6)`,
			hashID(id), state, nonce, verifier, next, u.now().Add(flowTTL))
		return err
	}); err != nil {
		u.d.Log.Error("sign-in through the provider failed to start", "error", err)
		u.loginFailed(w, r, http.StatusServiceUnavailable, "Sign-in is unavailable; try again later.", next)
		return
	}
	http.SetCookie(w, u.flowCookieFor(id, int(flowTTL.Seconds())))
	http.Redirect(w, r, u.d.SSO.AuthURL(state, nonce, verifier), http.StatusSeeOther)
}

// Provider error codes (RFC 6749 4.1.2.1, OpenID Connect Core 3.1.2.6)
// worth a sentence of their own.
var providerErrors = map[string]string{
	"access_denied":           "The provider refused the sign-in (access_denied): your account there may be disabled or removed, or the sign-in was cancelled.",
	"login_required":          "The provider requires you to sign in there first (login_required).",
	"interaction_required":    "The provider needs you to complete a step there first (interaction_required).",
	"consent_required":        "The provider needs your consent for arap first (consent_required).",
	"temporarily_unavailable": "The provider is temporarily unavailable (temporarily_unavailable); try again later.",
}

func (u *UI) oidcCallback(w http.ResponseWriter, r *http.Request) {
	if u.d.SSO == nil {
		http.NotFound(w, r)
		return
	}
	ctx := r.Context()
	http.SetCookie(w, u.flowCookieFor("", -1))
	fail := func(status int, check, msg, next string) {
		u.d.Log.Warn("sign-in through the provider refused", "issuer", u.d.SSO.Issuer(), "check", check)
		u.loginFailed(w, r, status, msg, next)
	}
	q := r.URL.Query()
	c, err := r.Cookie(flowCookie)
	var state, nonce, verifier, next string
	if err == nil {
		// Taken out, not read: a flow is used once, whatever the outcome.
		err = u.d.DB.QueryRow(ctx, `DELETE FROM arap.ui_oidc_flows WHERE id_hash = $1 AND expires_at >= $2 RETURNING state, nonce, verifier, next`,
			hashID(c.Value), u.now()).Scan(&state, &nonce, &verifier, &next)
	}
	if err != nil {
		if !errors.Is(err, http.ErrNoCookie) && !errors.Is(err, pgx.ErrNoRows) {
			u.d.Log.Error("sign-in through the provider failed", "error", err)
			u.loginFailed(w, r, http.StatusServiceUnavailable, "Sign-in is unavailable; try again later.", "")
			return
		}
		fail(http.StatusBadRequest, "flow", "This sign-in was not started in this browser, was already used, or took longer than 10 minutes. Start again.", "")
		return
	}
	if got := q.Get("state"); got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(state)) != 1 {
		fail(http.StatusBadRequest, "state", "Sign-in refused: the answer from the provider does not belong to this sign-in (state mismatch). Start again.", next)
		return
	}
	if code := q.Get("error"); code != "" {
		msg, ok := providerErrors[code]
		if !ok {
			msg = "The provider refused the sign-in."
		}
		u.d.Log.Warn("the provider refused the sign-in", "issuer", u.d.SSO.Issuer(), "error", clip(code), "error_description", clip(q.Get("error_description")))
		u.loginFailed(w, r, http.StatusForbidden, msg, next)
		return
	}
	code := q.Get("code")
	if code == "" {
		fail(http.StatusBadRequest, "code", "Sign-in refused: the provider's answer has no authorization code.", next)
		return
	}
	id, err := u.d.SSO.Callback(ctx, code, verifier, nonce)
	if err != nil {
		var ce *sso.CheckError
		if !errors.As(err, &ce) {
			ce = &sso.CheckError{Check: "the sign-in could not be completed", Err: err}
		}
		u.d.Log.Warn("sign-in through the provider refused", "issuer", u.d.SSO.Issuer(), "check", ce.Check, "error", ce.Err.Error())
		u.loginFailed(w, r, http.StatusUnauthorized, "Sign-in refused: "+ce.Check+".", next)
		return
	}
	var notice string
	if id.Email != "" && !id.EmailVerified {
		// Nobody proved the address: it is neither stored nor used.
		u.d.Log.Warn("the provider did not verify the e-mail address of a user; it is not used", "issuer", id.Issuer, "subject", id.Subject)
		notice = "Your identity provider has not verified your e-mail address, so arap does not use it: no e-mail notifications reach you, and requests naming that address are not recognised as yours, until the provider verifies it."
	}
	preferred := id.PreferredUsername
	if preferred == "" && id.EmailVerified {
		preferred = id.Email
	}
	user, err := u.d.Directory.SignInExternal(ctx, directory.External{Issuer: id.Issuer, Subject: id.Subject,
		PreferredName: preferred, DisplayName: id.Name, Email: id.Email, EmailVerified: id.EmailVerified,
		SyncGroups: id.GroupsClaim, Groups: id.Groups})
	if errors.Is(err, directory.ErrUserDisabled) {
		fail(http.StatusForbidden, "disabled", "This account is disabled in arap.", next)
		return
	}
	var sid string
	if err == nil {
		err = pgx.BeginFunc(ctx, u.d.DB, func(tx pgx.Tx) error {
			sid, err = u.openSession(ctx, tx, user.Name, id.Issuer, id.Subject)
			return err
		})
	}
	if err != nil {
		u.d.Log.Error("sign-in through the provider failed", "error", err)
		u.loginFailed(w, r, http.StatusServiceUnavailable, "Sign-in is unavailable; try again later.", next)
		return
	}
	u.d.Log.Info("signed in through the provider", "user", user.Name, "issuer", id.Issuer, "subject", id.Subject)
	http.SetCookie(w, u.cookie(loginCSRFKey, "", -1))
	http.SetCookie(w, u.cookie(cookieName, sid, int(sessionTTL.Seconds())))
	// Not a redirect: after the provider's cross-site redirects, browsers
	// would not send the SameSite=Strict session cookie on the next
	// request; a navigation started by this page of ours does.
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	// With a notice, the page waits for the person to read it.
	_ = continuePage.Execute(w, struct{ Next, Notice string }{next, notice})
}

var continuePage = template.Must(template.New("continue").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">{{if not .Notice}}<meta http-equiv="refresh" content="0; url={{.Next}}">{{end}}<title>Signed in</title>
<link rel="stylesheet" href="/ui/assets/app.css"></head>
<body><main id="main"><section class="card narrow"><h1>Signed in</h1>
{{if .Notice}}<p class="error" role="alert" id="notice">{{.Notice}}</p>{{end}}
<p><a class="button primary" id="continue" href="{{.Next}}">Continue</a></p></section></main></body></html>
`))

// clip bounds a provider-supplied string before it is logged.
func clip(s string) string {
	if len(s) > 200 {
		return s[:200]
	}
	return s
}
