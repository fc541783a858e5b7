// Package sso is the OpenID Connect relying party of the approver web UI:
// it reads the provider's discovery document and keys at start-up (a
// provider that is unreachable, names another issuer or publishes no keys
// stops the backend from starting), builds authorization requests (code
// flow with PKCE S256, state and nonce), and on the callback exchanges the
// code and verifies the ID token (signature against the provider's JWKS,
// issuer, audience = our client id, expiry, nonce, authorized party)
// before reading the claims. Who the verified claims make a user is the directory's business;
// the web UI keeps the flow state and the session.
package sso

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	jose "github.com/go-jose/go-jose/v4"
	"golang.org/x/oauth2"
)

// Config configures the relying party.
type Config struct {
	// Issuer is the provider's issuer URL, exactly as its discovery document
	// states it (https; http only on loopback).
	Issuer       string
	ClientID     string
	ClientSecret string
	// RedirectURL is <public URL>/ui/oidc/callback (the backend derives it).
	RedirectURL string
	// Scopes requested; DefaultScopes when empty ("openid" is always sent).
	Scopes []string
	// GroupsClaim, if set, names the ID token claim whose values are the
	// user's directory groups (the provider is then the source of
	// membership for its users).
	GroupsClaim string
	// Name labels the sign-in button ("Sign in with <Name>"); DefaultName
	// when empty.
	Name string
	// Timeout bounds each request to the provider; 10 seconds when zero.
	Timeout time.Duration
}

// Defaults.
var (
	DefaultScopes = []string{oidc.ScopeOpenID, "email", "profile"}
	DefaultName   = "single sign-on"
)

// RP is a relying party whose provider was discovered.
type RP struct {
	cfg      Config
	oauth    oauth2.Config
	verifier *oidc.IDTokenVerifier
	client   *http.Client
}

// New checks cfg and discovers the provider: its discovery document must
// name cfg.Issuer, have authorization, token and JWKS endpoints, and its
// JWKS must hold a signing key. Every error names the issuer and the step
// that failed.
func New(ctx context.Context, cfg Config) (*RP, error) {
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if len(cfg.Scopes) == 0 {
		cfg.Scopes = DefaultScopes
	}
	if !slices.Contains(cfg.Scopes, oidc.ScopeOpenID) {
		cfg.Scopes = append([]string{oidc.ScopeOpenID}, cfg.Scopes...)
	}
	iu, err := url.Parse(cfg.Issuer)
	switch {
	case cfg.Issuer == "":
		return nil, errors.New("sso: an issuer URL is required (--oidc-issuer)")
	case err != nil || iu.Host == "" || (iu.Scheme != "https" && !(iu.Scheme == "http" && loopback(iu.Hostname()))):
		return nil, fmt.Errorf("sso: issuer %q must be an https URL (http only on loopback)", cfg.Issuer)
	case cfg.ClientID == "":
		return nil, fmt.Errorf("sso: issuer %s: a client id is required (--oidc-client-id)", cfg.Issuer)
	case cfg.ClientSecret == "":
		return nil, fmt.Errorf("sso: issuer %s: a client secret is required (ARAP_OIDC_CLIENT_SECRET or --oidc-client-secret-file)", cfg.Issuer)
	}
	if ru, err := url.Parse(cfg.RedirectURL); err != nil || !ru.IsAbs() {
		return nil, fmt.Errorf("sso: redirect URL %q must be absolute", cfg.RedirectURL)
	}
	client := &http.Client{Timeout: cfg.Timeout}
	// The provider keeps this context to fetch keys later: no deadline here,
	// the client's timeout bounds each request.
	pctx := oidc.ClientContext(context.WithoutCancel(ctx), client)
	p, err := oidc.NewProvider(pctx, cfg.Issuer)
	if err != nil {
		var mismatch *oidc.IssuerMismatchError
		if errors.As(err, &mismatch) {
			return nil, fmt.Errorf("sso: issuer %s: the discovery document names issuer %q; the configured issuer must be exactly that", cfg.Issuer, mismatch.Discovered)
		}
		return nil, fmt.Errorf("sso: issuer %s: discovery (%s/.well-known/openid-configuration): %w", cfg.Issuer, strings.TrimSuffix(cfg.Issuer, "/"), err)
	}
	var doc struct {
		JWKSURL string `json:"jwks_uri"`
	}
	if err := p.Claims(&doc); err != nil {
		return nil, fmt.Errorf("sso: issuer %s: discovery document: %w", cfg.Issuer, err)
	}
	ep := p.Endpoint()
	switch {
	case ep.AuthURL == "":
		return nil, fmt.Errorf("sso: issuer %s: the discovery document has no authorization_endpoint", cfg.Issuer)
	case ep.TokenURL == "":
		return nil, fmt.Errorf("sso: issuer %s: the discovery document has no token_endpoint", cfg.Issuer)
	case doc.JWKSURL == "":
		return nil, fmt.Errorf("sso: issuer %s: the discovery document has no jwks_uri", cfg.Issuer)
	}
	if err := checkJWKS(ctx, client, doc.JWKSURL); err != nil {
		return nil, fmt.Errorf("sso: issuer %s: JWKS %s: %w", cfg.Issuer, doc.JWKSURL, err)
	}
	return &RP{
		cfg:    cfg,
		client: client,
		oauth: oauth2.Config{ClientID: cfg.ClientID, ClientSecret: cfg.ClientSecret, Endpoint: ep,
			RedirectURL: cfg.RedirectURL, Scopes: cfg.Scopes},
		verifier: p.Verifier(&oidc.Config{ClientID: cfg.ClientID}),
	}, nil
}

// maxJWKS bounds the key set read at start-up.
const maxJWKS = 1 << 20

// checkJWKS fetches the key set once, so that a provider without usable
// keys is found at start-up rather than at the first sign-in.
func checkJWKS(ctx context.Context, client *http.Client, u string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("answered %s", resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKS))
	if err != nil {
		return err
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(body, &set); err != nil {
		return fmt.Errorf("not a JSON Web Key Set: %w", err)
	}
	for _, k := range set.Keys {
		if k.Use != "enc" && k.Valid() {
			return nil
		}
	}
	return errors.New("holds no signing key")
}

func loopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}

// Name is the provider's label on the sign-in button.
func (rp *RP) Name() string { return rp.cfg.Name }

// Issuer is the provider's issuer URL.
func (rp *RP) Issuer() string { return rp.cfg.Issuer }

// AuthURL is where the browser goes to sign in: an authorization code
// request carrying state, nonce and the S256 challenge of verifier.
func (rp *RP) AuthURL(state, nonce, verifier string) string {
	return rp.oauth.AuthCodeURL(state, oidc.Nonce(nonce), oauth2.S256ChallengeOption(verifier))
}

// Identity is what the verified ID token says about who signed in.
type Identity struct {
	Issuer            string
	Subject           string
	Name              string
	PreferredUsername string
	Email             string
	EmailVerified     bool
	// Groups are the groups claim's values; GroupsClaim reports whether a
	// groups claim is configured (then an absent claim means no groups).
	Groups      []string
	GroupsClaim bool
}

// CheckError is a callback the RP refused. Check names the check that
// failed, in words fit for the sign-in page; Err is the detail for the log.
// Neither carries a token or a code.
type CheckError struct {
	Check string
	Err   error
}

func (e *CheckError) Error() string { return "sso: " + e.Check + ": " + e.Err.Error() }
func (e *CheckError) Unwrap() error { return e.Err }

// Checks, as CheckError.Check names them.
const (
	CheckExchange  = "the code exchange with the provider failed"
	CheckNoIDToken = "the provider returned no ID token"
	CheckSignature = "the ID token's signature did not verify"
	CheckIssuer    = "the ID token was issued by another issuer"
	CheckAudience  = "the ID token is for another client (audience)"
	CheckExpiry    = "the ID token has expired"
	CheckNotBefore = "the ID token is not valid yet"
	CheckNonce     = "the ID token's nonce does not match this sign-in"
	CheckAZP       = "the ID token's authorized party is another client"
	CheckClaims    = "the ID token's claims could not be read"
)

// maxGroups bounds the values taken from the groups claim.
const maxGroups = 1000

// Callback exchanges code (with the PKCE verifier) for tokens and verifies
// the ID token: signature, issuer, audience, expiry (go-oidc), then the
// nonce of this sign-in and the authorized party (azp: present with several
// audiences, and ours whenever present).
func (rp *RP) Callback(ctx context.Context, code, verifier, nonce string) (*Identity, error) {
	ctx = context.WithValue(ctx, oauth2.HTTPClient, rp.client)
	tok, err := rp.oauth.Exchange(ctx, code, oauth2.VerifierOption(verifier))
	if err != nil {
		var re *oauth2.RetrieveError
		if errors.As(err, &re) {
			// The body may echo request parameters; only the error code is kept.
			err = fmt.Errorf("token endpoint answered %d %s", re.Response.StatusCode, re.ErrorCode)
		}
		return nil, &CheckError{CheckExchange, err}
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		return nil, &CheckError{CheckNoIDToken, errors.New("no id_token in the token response")}
	}
	idt, err := rp.verifier.Verify(ctx, raw)
	if err != nil {
		return nil, &CheckError{classify(err), err}
	}
	if subtle.ConstantTimeCompare([]byte(idt.Nonce), []byte(nonce)) != 1 || nonce == "" {
		return nil, &CheckError{CheckNonce, errors.New("nonce mismatch")}
	}
	var c struct {
		AZP               string `json:"azp"`
		Name              string `json:"name"`
		GivenName         string `json:"given_name"`
		FamilyName        string `json:"family_name"`
		PreferredUsername string `json:"preferred_username"`
		Email             string `json:"email"`
		// Some providers send "true" as a string.
		EmailVerified any `json:"email_verified"`
	}
	var all map[string]json.RawMessage
	if err := idt.Claims(&c); err != nil {
		return nil, &CheckError{CheckClaims, err}
	}
	if err := idt.Claims(&all); err != nil {
		return nil, &CheckError{CheckClaims, err}
	}
	// azp names the client the token was issued to (OIDC Core 1.0,
	// 3.1.3.7 steps 4 and 5): required with several audiences, and never
	// another client, since we redeemed the code ourselves.
	if (len(idt.Audience) > 1 || c.AZP != "") && c.AZP != rp.cfg.ClientID {
		return nil, &CheckError{CheckAZP, fmt.Errorf("azp %q with audiences %q", c.AZP, idt.Audience)}
	}
	if idt.Subject == "" {
		return nil, &CheckError{CheckClaims, errors.New("no subject")}
	}
	id := &Identity{Issuer: idt.Issuer, Subject: idt.Subject, Name: c.Name, PreferredUsername: c.PreferredUsername,
		Email: c.Email, EmailVerified: c.EmailVerified == true || c.EmailVerified == "true"}
	if id.Name == "" {
		id.Name = strings.TrimSpace(c.GivenName + " " + c.FamilyName)
	}
	if rp.cfg.GroupsClaim != "" {
		id.GroupsClaim = true
		id.Groups = groups(all[rp.cfg.GroupsClaim])
	}
	return id, nil
}

// groups reads a claim that is a list of strings or one string; other
// values are ignored.
func groups(raw json.RawMessage) []string {
	var list []any
	if json.Unmarshal(raw, &list) != nil {
		var one string
		if json.Unmarshal(raw, &one) != nil || one == "" {
			return nil
		}
		return []string{one}
	}
	var out []string
	for _, v := range list {
		if s, ok := v.(string); ok && len(out) < maxGroups {
			out = append(out, s)
		}
	}
	return out
}

// classify names the check go-oidc's verifier refused. Its errors are not
// typed apart from expiry; the messages are pinned by this package's tests.
func classify(err error) string {
	var exp *oidc.TokenExpiredError
	msg := err.Error()
	switch {
	case errors.As(err, &exp):
		return CheckExpiry
	case strings.Contains(msg, "expected audience"):
		return CheckAudience
	case strings.Contains(msg, "issued by a different provider"):
		return CheckIssuer
	case strings.Contains(msg, "before the nbf"):
		return CheckNotBefore
	case strings.Contains(msg, "claims"):
		return CheckClaims
	default:
		return CheckSignature
	}
}
