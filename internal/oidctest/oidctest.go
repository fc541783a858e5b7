// Package oidctest runs a real OpenID provider on loopback for tests: the
// op package of github.com/zitadel/oidc on the library's own in-memory
// example storage, wrapped so that a test can change users (groups,
// disabled, removed) and make the provider misbehave (another audience,
// another nonce, expired ID tokens). Its login page is a plain user name and
// password form; a disabled user is sent back to the client with
// error=access_denied, as providers do.
package oidctest

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"html/template"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	jose "github.com/go-jose/go-jose/v4"
	"github.com/zitadel/oidc/v3/example/server/storage"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
	"golang.org/x/text/language"
)

// Client credentials the provider knows.
const (
	ClientID     = "arap-web"
	ClientSecret = "arap-web-secret"
	// GroupsClaim is the claim the provider puts users' groups in.
	GroupsClaim = "groups"
)

// User is a person at the provider.
type User struct {
	ID            string // the subject
	Username      string
	Password      string
	GivenName     string
	FamilyName    string
	Email         string
	EmailVerified bool
	Groups        []string
	Disabled      bool
}

// Faults make the provider issue ID tokens a relying party must refuse.
type Faults struct {
	// Audience replaces the ID token's audience. The op package always
	// adds the client id, so the token endpoint's answer is rewritten:
	// the ID token re-signed with the provider's own key.
	Audience        []string
	Nonce           string        // instead of the request's nonce
	IDTokenLifetime time.Duration // instead of an hour (negative: expired)
}

// OP is a running provider.
type OP struct {
	// Issuer is the provider's issuer URL (http on loopback).
	Issuer string

	mu        sync.Mutex
	keys      []*signingKey // the current signing key last
	users     map[string]*User
	redirects []string
	faults    Faults
	provider  *op.Provider
	store     *store
}

// Start runs a provider on 127.0.0.1 until the test ends.
func Start(t testing.TB) *OP { return StartOn(t, "127.0.0.1") }

// StartOn is Start with the issuer URL naming host (which must resolve to
// 127.0.0.1): "localhost" puts the provider on another site than a relying
// party at 127.0.0.1, as in production, so that browsers apply their
// cross-site cookie rules to the redirects between them.
func StartOn(t testing.TB, host string) *OP {
	t.Helper()
	o := &OP{users: map[string]*User{}, redirects: []string{AgentRedirect}}
	srv := httptest.NewUnstartedServer(nil)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	o.Issuer = "http://" + net.JoinHostPort(host, port)
	client := storage.WebClient(ClientID, ClientSecret, "http://unused.invalid/")
	agent := storage.WebClient(AgentClientID, AgentClientSecret, AgentRedirect)
	o.store = &store{Storage: storage.NewStorageWithClients(userStore{o}, map[string]*storage.Client{ClientID: client, AgentClientID: agent}), op: o}
	o.rotateKey()
	var key [32]byte
	_, _ = rand.Read(key[:])
	p, err := op.NewProvider(&op.Config{CryptoKey: key, CodeMethodS256: true, AuthMethodPost: true,
		SupportedUILocales: []language.Tag{language.English}}, o.store, op.StaticIssuer(o.Issuer), op.WithAllowInsecure())
	if err != nil {
		t.Fatal(err)
	}
	o.provider = p
	r := chi.NewRouter()
	in := op.NewIssuerInterceptor(p.IssuerFromRequest)
	r.Get("/login/username", o.loginPage)
	r.Post("/login/username", in.HandlerFunc(o.login))
	r.With(o.tamper).Post("/oauth/token", p.ServeHTTP)
	r.Mount("/", p)
	srv.Config.Handler = r
	srv.Start()
	t.Cleanup(srv.Close)
	return o
}

// AllowRedirect registers a redirect URI of the client.
func (o *OP) AllowRedirect(uri string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.redirects = append(o.redirects, uri)
}

// Put adds or replaces a user.
func (o *OP) Put(u User) {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := u
	c.Groups = slices.Clone(u.Groups)
	o.users[u.ID] = &c
}

// Update changes a user in place.
func (o *OP) Update(id string, f func(*User)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	f(o.users[id])
}

// Remove deletes a user.
func (o *OP) Remove(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.users, id)
}

// SetFaults sets how the next ID tokens are wrong (Faults{} for none).
func (o *OP) SetFaults(f Faults) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.faults = f
}

func (o *OP) user(pred func(*User) bool) *User {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, u := range o.users {
		if pred(u) {
			c := *u
			return &c
		}
	}
	return nil
}

func (o *OP) faultsNow() Faults {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.faults
}

var loginForm = template.Must(template.New("login").Parse(`<!doctype html>
<html><head><title>Test provider: sign in</title></head><body>
<h1>Test provider</h1>
{{if .Error}}<p id="op-error">{{.Error}}</p>{{end}}
<form method="post" action="/login/username">
<input type="hidden" name="id" value="{{.ID}}">
<label>User <input id="op-username" name="username"></label>
<label>Password <input id="op-password" name="password" type="password"></label>
<button id="op-submit" type="submit">Log in</button>
</form></body></html>`))

func (o *OP) loginPage(w http.ResponseWriter, r *http.Request) {
	_ = loginForm.Execute(w, map[string]string{"ID": r.URL.Query().Get("authRequestID")})
}

func (o *OP) login(w http.ResponseWriter, r *http.Request) {
	id, name, password := r.FormValue("id"), r.FormValue("username"), r.FormValue("password")
	u := o.user(func(u *User) bool { return u.Username == name })
	if u != nil && u.Password == password && u.Disabled {
		req, err := o.store.AuthRequestByID(r.Context(), id)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		op.AuthRequestError(w, r, req, oidc.ErrAccessDenied().WithDescription("the user is disabled"), o.provider)
		return
	}
	if err := o.store.CheckUsernamePassword(name, password, id); err != nil {
		w.WriteHeader(http.StatusUnauthorized)
		_ = loginForm.Execute(w, map[string]string{"ID": id, "Error": err.Error()})
		return
	}
	http.Redirect(w, r, op.AuthCallbackURL(o.provider)(r.Context(), id), http.StatusFound)
}

// userStore is the example storage's user lookup, over OP's users. A
// disabled user is found (the login refuses it); a removed one is not.
type userStore struct{ o *OP }

func (s userStore) GetUserByID(id string) *storage.User {
	return s.convert(s.o.user(func(u *User) bool { return u.ID == id }))
}

func (s userStore) GetUserByUsername(name string) *storage.User {
	return s.convert(s.o.user(func(u *User) bool { return u.Username == name }))
}

func (userStore) ExampleClientID() string { return "service" }

func (userStore) convert(u *User) *storage.User {
	if u == nil {
		return nil
	}
	return &storage.User{ID: u.ID, Username: u.Username, Password: u.Password, FirstName: u.GivenName, LastName: u.FamilyName,
		Email: u.Email, EmailVerified: u.EmailVerified, PreferredLanguage: language.English}
}

// store is the example storage with the test's faults and groups.
type store struct {
	*storage.Storage
	op *OP
}

func (s *store) GetClientByClientID(ctx context.Context, id string) (op.Client, error) {
	c, err := s.Storage.GetClientByClientID(ctx, id)
	if err != nil {
		return nil, err
	}
	return client{Client: c, op: s.op, jwt: id == AgentClientID}, nil
}

func (s *store) AuthRequestByCode(ctx context.Context, code string) (op.AuthRequest, error) {
	r, err := s.Storage.AuthRequestByCode(ctx, code)
	if err != nil {
		return nil, err
	}
	return authRequest{AuthRequest: r, faults: s.op.faultsNow()}, nil
}

// SetUserinfoFromRequest adds the groups claim to ID tokens.
func (s *store) SetUserinfoFromRequest(ctx context.Context, info *oidc.UserInfo, req op.IDTokenRequest, scopes []string) error {
	if err := s.Storage.SetUserinfoFromRequest(ctx, info, req, scopes); err != nil {
		return err
	}
	if u := s.op.user(func(u *User) bool { return u.ID == req.GetSubject() }); u != nil {
		info.AppendClaims(GroupsClaim, append([]string{}, u.Groups...))
	}
	return nil
}

type client struct {
	op.Client
	op  *OP
	jwt bool // issues JWT access tokens (the agents' client)
}

// AccessTokenType: the agents' client gets JWT access tokens (RFC 9068),
// as an MCP server verifies them; the web client opaque ones.
func (c client) AccessTokenType() op.AccessTokenType {
	if c.jwt {
		return op.AccessTokenTypeJWT
	}
	return c.Client.AccessTokenType()
}

func (c client) RedirectURIs() []string {
	c.op.mu.Lock()
	defer c.op.mu.Unlock()
	return slices.Clone(c.op.redirects)
}

func (c client) IDTokenLifetime() time.Duration {
	if l := c.op.faultsNow().IDTokenLifetime; l != 0 {
		return l
	}
	return time.Hour
}

// IDTokenUserinfoClaimsAssertion puts profile and e-mail claims in the ID
// token, as most providers do.
func (client) IDTokenUserinfoClaimsAssertion() bool { return true }

type authRequest struct {
	op.AuthRequest
	faults Faults
}

func (r authRequest) GetNonce() string {
	if r.faults.Nonce != "" {
		return r.faults.Nonce
	}
	return r.AuthRequest.GetNonce()
}

// tamper rewrites the token endpoint's answer when Faults.Audience is set.
func (o *OP) tamper(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		aud := o.faultsNow().Audience
		if aud == nil {
			next.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		body := rec.Body.Bytes()
		if rec.Code == http.StatusOK {
			var err error
			if body, err = o.reaudience(r.Context(), body, aud); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.Header().Del("Content-Length")
		w.WriteHeader(rec.Code)
		_, _ = w.Write(body)
	})
}

func (o *OP) reaudience(ctx context.Context, body []byte, aud []string) ([]byte, error) {
	var resp map[string]any
	if err := json.Unmarshal(body, &resp); err != nil {
		return nil, err
	}
	raw, _ := resp["id_token"].(string)
	key, err := o.store.SigningKey(ctx)
	if err != nil {
		return nil, err
	}
	jws, err := jose.ParseSigned(raw, []jose.SignatureAlgorithm{key.SignatureAlgorithm()})
	if err != nil {
		return nil, err
	}
	var claims map[string]any
	if err := json.Unmarshal(jws.UnsafePayloadWithoutVerification(), &claims); err != nil {
		return nil, err
	}
	claims["aud"] = aud
	payload, err := json.Marshal(claims)
	if err != nil {
		return nil, err
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: key.SignatureAlgorithm(), Key: jose.JSONWebKey{Key: key.Key(), KeyID: key.ID()}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		return nil, err
	}
	signed, err := signer.Sign(payload)
	if err != nil {
		return nil, err
	}
	if resp["id_token"], err = signed.CompactSerialize(); err != nil {
		return nil, err
	}
	return json.Marshal(resp)
}
