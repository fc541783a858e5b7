// Package webui is the approvers' web interface, served by the backend at
// /ui/: sign-in with local accounts (secure session cookies, CSRF tokens on
// every form, failed sign-ins slowing the client that made them rather than
// locking the account), the queue of requests the person may decide, a
// request page that shows exactly what is asked (tool, every argument, who
// for and through which agent, the justification, the rule, quorum
// progress, time left, the audit trail) with approve and deny, and the
// history. Pages are server-rendered html/template with embedded assets and
// one small script that refreshes them in place.
package webui

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/directory"
	"github.com/omcp/arap/internal/clientip"
	"github.com/omcp/arap/internal/dbdown"
	"github.com/omcp/arap/internal/ratelimit"
	"github.com/omcp/arap/internal/summary"
	"github.com/omcp/arap/passkeys"
	"github.com/omcp/arap/requests"
	"github.com/omcp/arap/sso"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets
var assetFS embed.FS

// Deps are what the UI needs.
type Deps struct {
	DB        *pgxpool.Pool
	Requests  *requests.Service
	Directory *directory.Store
	// Counters count the sign-in attempts per address (arap.rate_counters),
	// for all replicas together.
	Counters *ratelimit.Counters
	// Passkeys registers approvers' passkeys and runs the signing of
	// decisions (nil when unavailable; PasskeysUnavailable says why).
	Passkeys            *passkeys.Service
	PasskeysUnavailable string
	// SSO, if set, signs approvers in through an OpenID provider (oidc.go).
	SSO *sso.RP
	// DisablePasswords turns local password sign-in off (SSO is then
	// required).
	DisablePasswords bool
	// Clients names the API clients that submitted requests (optional: the
	// page shows the id alone without it).
	Clients interface {
		NameOf(ctx context.Context, id string) (string, error)
	}
	// Secure marks cookies Secure (the public URL is https).
	Secure bool
	Now    func() time.Time
	Log    *slog.Logger
}

// UI is the web interface's handler, mounted at /ui/.
type UI struct {
	d       Deps
	pages   map[string]*template.Template
	logins  *ratelimit.Limiter
	handler http.Handler
}

// New builds the UI.
func New(d Deps) (*UI, error) {
	if d.DB == nil || d.Requests == nil || d.Directory == nil || d.Counters == nil {
		return nil, errors.New("webui: DB, Requests, Directory and Counters are required")
	}
	if d.DisablePasswords && d.SSO == nil {
		return nil, errors.New("webui: with local passwords off, an OpenID provider is required, or nobody can sign in")
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	u := &UI{d: d, pages: map[string]*template.Template{}}
	var err error
	if u.logins, err = d.Counters.NewLimiter("ui-login", LoginsPerMinute, time.Minute); err != nil {
		return nil, err
	}
	for _, page := range []string{"login", "queue", "request", "history", "passkeys"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+page+".html")
		if err != nil {
			return nil, fmt.Errorf("webui: template %s: %w", page, err)
		}
		u.pages[page] = t
	}
	u.handler = u.routes()
	return u, nil
}

func (u *UI) now() time.Time { return u.d.Now() }

func (u *UI) ServeHTTP(w http.ResponseWriter, r *http.Request) { u.handler.ServeHTTP(w, r) }

// routes lists every page of the UI.
func (u *UI) routes() http.Handler {
	r := chi.NewRouter()
	// Cross-origin form posts are refused before any handler runs (the
	// browser's Sec-Fetch-Site, or Origin against Host); the per-session
	// CSRF token on every form is the second lock.
	r.Use(headers, http.NewCrossOriginProtection().Handler)
	assets, _ := fs.Sub(assetFS, "assets")
	r.Handle("/ui/assets/*", http.StripPrefix("/ui/assets/", http.FileServer(http.FS(assets))))
	r.Get("/ui/login", u.loginPage)
	r.With(u.logins.Middleware(clientip.Key, tooManyLogins, u.fail)).Post("/ui/login", u.login)
	r.With(u.logins.Middleware(clientip.Key, tooManyLogins, u.fail)).Get("/ui/login/oidc", u.oidcStart)
	r.Get("/ui/oidc/callback", u.oidcCallback)
	r.Group(func(r chi.Router) {
		r.Use(u.requireSession)
		r.Get("/ui/", u.queue)
		r.Get("/ui/history", u.history)
		r.Get("/ui/requests/{id}", u.request)
		r.Post("/ui/requests/{id}/decide", u.decide)
		r.Post("/ui/requests/{id}/challenge", u.challenge)
		r.Get("/ui/passkeys", u.passkeysPage)
		r.Post("/ui/passkeys/register", u.beginRegistration)
		r.Post("/ui/passkeys/register/finish", u.finishRegistration)
		r.Post("/ui/passkeys/remove", u.removePasskey)
		r.Post("/ui/logout", u.logout)
	})
	r.Get("/ui", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ui/", http.StatusFound) })
	return r
}

// LoginsPerMinute bounds sign-in attempts from one address (an IPv4
// address or an IPv6 /64), across all replicas.
const LoginsPerMinute = 30

func tooManyLogins(w http.ResponseWriter, _ *http.Request) {
	http.Error(w, "Too many sign-in attempts from this address; try again in "+w.Header().Get("Retry-After")+" seconds.", http.StatusTooManyRequests)
}

// maxForm bounds a form post; the largest is a decision with its reason.
const maxForm = 16 << 10

// headers forbid framing, sniffing and any script or style from elsewhere,
// and bound request bodies.
func headers(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("Cache-Control", "no-store")
		r.Body = http.MaxBytesReader(w, r.Body, maxForm)
		next.ServeHTTP(w, r)
	})
}

type ctxKey struct{}

func (u *UI) requireSession(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, err := u.current(r)
		if err != nil {
			u.fail(w, r, err)
			return
		}
		if s == nil {
			http.Redirect(w, r, "/ui/login?next="+url.QueryEscape(r.URL.Path), http.StatusSeeOther)
			return
		}
		next.ServeHTTP(w, r.WithContext(contextWith(r, s)))
	})
}

func sessionFrom(r *http.Request) *session { s, _ := r.Context().Value(ctxKey{}).(*session); return s }

// page is what every template gets.
type page struct {
	Title   string
	User    *directory.User
	CSRF    string
	Flash   string
	Error   string
	Refresh bool // the main section refreshes itself
	Data    any
}

// render writes a page, or only its main section when the page script asks
// for a refresh (X-Partial).
func (u *UI) render(w http.ResponseWriter, r *http.Request, name string, status int, p page) {
	var buf bytes.Buffer
	tmpl := "layout.html"
	if r.Header.Get("X-Partial") == "1" {
		tmpl = "main"
	}
	if err := u.pages[name].ExecuteTemplate(&buf, tmpl, p); err != nil {
		u.d.Log.Error("render failed", "page", name, "error", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func (u *UI) voter(s *session) requests.Voter {
	return requests.UserVoter(s.user.Name, s.user.Identities(), s.user.Groups)
}

func (u *UI) loginPage(w http.ResponseWriter, r *http.Request) {
	if s, _ := u.current(r); s != nil {
		http.Redirect(w, r, "/ui/", http.StatusSeeOther)
		return
	}
	token := randomToken()
	http.SetCookie(w, u.cookie(loginCSRFKey, token, 600))
	u.render(w, r, "login", http.StatusOK, page{Title: "Sign in", CSRF: token, Data: u.loginData(r.URL.Query().Get("next"), "")})
}

// safeNext keeps redirects inside the UI.
func safeNext(n string) string {
	if !strings.HasPrefix(n, "/ui/") || strings.HasPrefix(n, "//") || strings.Contains(n, "\\") {
		return "/ui/"
	}
	return n
}

func (u *UI) login(w http.ResponseWriter, r *http.Request) {
	if u.d.DisablePasswords {
		u.passwordsOff(w, r)
		return
	}
	c, err := r.Cookie(loginCSRFKey)
	if err != nil || !u.checkCSRF(r, c.Value) {
		http.Error(w, "the form has expired or did not come from this site; reload the page and sign in again", http.StatusForbidden)
		return
	}
	name := strings.ToLower(strings.TrimSpace(r.PostFormValue("username")))
	id, device, err := u.signIn(r.Context(), r, name, r.PostFormValue("password"))
	if err != nil {
		token := randomToken()
		http.SetCookie(w, u.cookie(loginCSRFKey, token, 600))
		status, msg := http.StatusUnauthorized, "Wrong user name or password."
		var te *throttledError
		var we *wrongPasswordError
		switch {
		case errors.As(err, &te):
			status = http.StatusTooManyRequests
			w.Header().Set("Retry-After", strconv.Itoa(seconds(te.retry)))
			msg = "Too many failed sign-ins for this account from here; try again in " + wait(te.retry) + "."
			if te.account {
				msg = "Too many failed sign-ins for this account from browsers it has not used before; try again in " + wait(te.retry) +
					", or from a browser you have signed in with before."
			}
		case errors.As(err, &we):
			msg = "Wrong user name or password. Wait " + wait(we.wait) + " before trying again."
		case dbdown.Is(err):
			u.d.Log.Warn("sign-in: database unavailable", "error", err)
			status = http.StatusServiceUnavailable
			w.Header().Set("Retry-After", dbdown.RetryAfterHeader)
			msg = "Sign-in is temporarily unavailable (the database cannot be reached); try again in " + dbdown.RetryAfterHeader + " seconds."
		case !errors.Is(err, directory.ErrBadPassword) && !errors.Is(err, directory.ErrUserDisabled):
			u.d.Log.Error("sign-in failed", "error", err)
			msg = "Sign-in is unavailable; try again later."
		}
		if !utf8.ValidString(name) || len(name) > 200 {
			name = "" // not echoed into the form
		}
		u.render(w, r, "login", status, page{Title: "Sign in", CSRF: token, Error: msg,
			Data: u.loginData(r.PostFormValue("next"), name)})
		return
	}
	http.SetCookie(w, u.cookie(loginCSRFKey, "", -1))
	http.SetCookie(w, u.cookie(cookieName, id, int(sessionTTL.Seconds())))
	http.SetCookie(w, u.cookie(deviceCookie, device, int(deviceTTL.Seconds())))
	http.Redirect(w, r, safeNext(r.PostFormValue("next")), http.StatusSeeOther)
}

// seconds rounds a wait up to whole seconds, at least one.
func seconds(d time.Duration) int { return max(1, int((d+time.Second-1)/time.Second)) }

// wait says how long to wait, in words.
func wait(d time.Duration) string {
	s := seconds(d)
	switch {
	case s == 1:
		return "1 second"
	case s < 120:
		return strconv.Itoa(s) + " seconds"
	default:
		return strconv.Itoa((s+59)/60) + " minutes"
	}
}

func (u *UI) logout(w http.ResponseWriter, r *http.Request) {
	s := sessionFrom(r)
	if !u.checkCSRF(r, s.csrf) {
		http.Error(w, "missing or wrong CSRF token", http.StatusForbidden)
		return
	}
	u.signOut(r)
	http.SetCookie(w, u.cookie(cookieName, "", -1))
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

// Item is a request as the pages show it. What the requester stated
// (subject, agent, tool, arguments, context) is kept apart from what policy
// derived (rule, display text, quorum, the evaluation it came from).
type Item struct {
	ID           string
	Status       string
	StatusReason string
	// From policy.
	Rule         string
	Title        string
	Why          string
	EvaluationID string
	BoundMembers []string
	// Stated by the requester.
	Tool        string
	Arguments   []Field
	Subject     string
	Actor       string
	SubmittedBy string
	// SubmitterName is SubmittedBy's name, where known.
	SubmitterName string
	// Upstream and UpstreamTool name a gateway tool's server and its name
	// there.
	Upstream, UpstreamTool string
	// Answers are the context members the rule asks for; Extra the ones it
	// does not (not asked for, not checked, unseen by automated resolvers).
	Answers []Field
	Extra   []Field
	// Hidden lists the hidden and look-alike characters on the page.
	Hidden        []Note
	HiddenOmitted int

	CreatedAt     time.Time
	ExpiresAt     time.Time
	TimeLeft      string
	Approvals     int
	Quorum        int
	RequireHumans int
	Votes         []requests.Vote
	MayDecide     bool
	WhyNot        string
	Audit         []audit.Record
	Approval      string
}

// Field is one rendered name and value.
type Field = summary.Field

// item is what the pages show of r. Its top (who, through which agent,
// which tool and arguments, the rule, time left) is summary.Of, the same
// function the notifications use.
func (u *UI) item(r *requests.Request, votes []requests.Vote, v requests.Voter) Item {
	sum := summary.Of(r, time.Now())
	it := Item{ID: r.ID, Status: string(r.Status), StatusReason: r.StatusReason, Rule: sum.Rule, Tool: sum.Tool,
		Subject: sum.Subject, CreatedAt: r.CreatedAt, ExpiresAt: sum.ExpiresAt, Title: sum.Title, Why: sum.Why,
		Arguments: sum.Arguments, Actor: sum.Actor, TimeLeft: sum.TimeLeft,
		Quorum: r.ApprovalPolicy.Quorum, RequireHumans: r.ApprovalPolicy.RequireHumans, Votes: votes,
		EvaluationID: r.EvaluationID, BoundMembers: r.BindingContextMembers, SubmittedBy: sum.SubmittedBy,
		Upstream: sum.Upstream, UpstreamTool: sum.UpstreamTool}
	if it.StatusReason == it.Status {
		it.StatusReason = ""
	}
	declared, extra := r.SplitContext()
	it.Answers, it.Extra = fields(declared), fields(extra)
	for _, vt := range votes {
		if vt.Decision == "approve" {
			it.Approvals++
		}
	}
	it.MayDecide, it.WhyNot = requests.MayDecide(v, r, votes, u.now())
	if r.Result != nil && r.Result.Approval != nil {
		it.Approval = "valid until " + r.Result.Approval.ApprovedUntil.UTC().Format("2006-01-02 15:04 MST")
	}

	var n notes
	sum.Note(&n)
	n.Value("answer", map[string]any(declared))
	n.Value("extra context member", map[string]any(extra))
	n.Text("the status reason", it.StatusReason)
	n.Text("why you cannot decide", it.WhyNot)
	for _, vt := range votes {
		n.Text("the voter "+vt.Voter, vt.Voter)
		if vt.Via != nil {
			n.Text("the client the vote of "+vt.Voter+" came through", vt.Via.Client)
		}
		n.Text("the reason of "+vt.Voter, vt.Reason)
	}
	it.Hidden, it.HiddenOmitted = n.List, n.Omitted
	return it
}

var (
	fields   = summary.Fields
	humanize = summary.Humanize
)

var funcs = template.FuncMap{
	"show":      show,
	"showBlock": showBlock,
	"showField": showField,
	"plain":     plain,
	"marker":    marker,
	"when":      func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 MST") },
	"ago": func(t time.Time) string {
		d := time.Since(t)
		if d < time.Minute {
			return "just now"
		}
		return humanize(d) + " ago"
	},
	"data": auditData,
}

// auditData is an audit event's data in one line: "name: value; ...".
func auditData(raw json.RawMessage) string {
	var m map[string]any
	if json.Unmarshal(raw, &m) != nil {
		return string(raw)
	}
	var parts []string
	for _, f := range fields(m) {
		if f.Value != "" && f.Value != "null" {
			parts = append(parts, f.Name+": "+strings.ReplaceAll(f.Value, "\n", " "))
		}
	}
	return strings.Join(parts, "; ")
}
