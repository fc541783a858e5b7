// Package agentauth makes arapd mcp an OAuth 2.1 protected resource as the
// MCP authorization specification (2025-11-25, unchanged in 2026-07-28)
// describes: it publishes its protected resource metadata (RFC 9728),
// answers a request without a usable token with a 401 whose
// WWW-Authenticate names that metadata (and 403 insufficient_scope when
// the scope is short), and verifies the access tokens of the authorization
// servers it trusts: JWTs (RFC 9068) against each issuer's keys, found
// through its metadata (RFC 8414) and refetched, rate-limited, when a token
// names a key not yet seen; opaque tokens through the issuer's
// introspection endpoint (RFC 7662), when configured. A token is for this
// resource only if its audience names it (RFC 8707).
//
// A verified token is an Identity: the subject, the delegation chain of its
// nested act claim (RFC 8693), the client it was issued to and its scopes.
// Package pep turns it into the caller's principal. Nothing here logs a
// token; an error says why a token was refused.
package agentauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"golang.org/x/time/rate"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/identity"
)

// Config configures a Verifier.
type Config struct {
	// Resource is this MCP endpoint's canonical URL: the audience a token
	// must name, and the metadata's resource.
	Resource string
	// Issuers are the authorization servers whose tokens are accepted, by
	// issuer identifier; the metadata lists them.
	Issuers []string
	// Scopes are required of every token, and advertised
	// (scopes_supported; the 401's scope).
	Scopes []string
	// SubjectClaim names the claim holding the subject (default "sub").
	SubjectClaim string
	// Introspect verifies opaque tokens at each issuer's introspection
	// endpoint, as this client (RFC 7662); without it an opaque token is
	// refused.
	Introspect *Client
	// Skew is the clock difference tolerated on exp, nbf and iat (30 s).
	Skew time.Duration
	// HTTP fetches metadata, keys and introspections (5 s per request).
	HTTP *http.Client
	Now  func() time.Time
}

// Client is this resource server's credentials at an authorization server.
type Client struct{ ID, Secret string }

// Identity is who a verified token speaks for.
type Identity struct {
	Issuer  string
	Subject string
	// Actors is the delegation chain of the token's act claim, the actor
	// acting now first (act.sub), then each earlier one (act.act.sub, ...).
	Actors []string
	// ClientID is the client the token was issued to (client_id, else azp).
	ClientID string
	Scopes   []string
	Expiry   time.Time
}

// Errors. A refused token wraps ErrInvalidToken (401) or
// ErrInsufficientScope (403); the rest of the message says why.
var (
	ErrInvalidToken      = errors.New("invalid_token")
	ErrInsufficientScope = errors.New("insufficient_scope")
)

// MaxToken bounds an access token, in bytes.
const MaxToken = 8 << 10

// algs are the signature algorithms accepted: asymmetric only, so a key
// published for verifying can never be used as an HMAC secret, and never
// none.
var algs = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

// Verifier verifies access tokens for one resource.
type Verifier struct {
	cfg     Config
	mu      sync.Mutex
	issuers map[string]*issuer
}

// issuer is what is known of a trusted authorization server: its metadata
// and keys, found on first use and looked for again, at most every
// retryDiscovery, while they cannot be.
type issuer struct {
	id        string
	mu        sync.Mutex
	meta      *oauthex.AuthServerMeta
	keys      keyfunc.Keyfunc
	failedAt  time.Time
	failedErr error
}

// retryDiscovery spaces attempts to find an issuer's metadata and keys
// while they fail; unknownKID spaces refetches of its keys for a token
// naming a key not seen (rotation), so a flood of forged key ids costs one
// fetch.
const (
	retryDiscovery = 10 * time.Second
	unknownKID     = 10 * time.Second
)

// New checks cfg and returns a Verifier; nothing is fetched until a token
// needs it.
func New(cfg Config) (*Verifier, error) {
	u, err := url.Parse(cfg.Resource)
	if err != nil || !u.IsAbs() || u.Fragment != "" || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, fmt.Errorf("agentauth: the resource %q must be an absolute http(s) URL without a fragment", cfg.Resource)
	}
	if len(cfg.Issuers) == 0 {
		return nil, errors.New("agentauth: at least one trusted issuer is required")
	}
	for _, iss := range cfg.Issuers {
		if u, err := url.Parse(iss); err != nil || !u.IsAbs() {
			return nil, fmt.Errorf("agentauth: issuer %q is not an absolute URL", iss)
		}
	}
	if cfg.SubjectClaim == "" {
		cfg.SubjectClaim = "sub"
	}
	if cfg.Skew == 0 {
		cfg.Skew = 30 * time.Second
	}
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Timeout: 5 * time.Second}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	v := &Verifier{cfg: cfg, issuers: map[string]*issuer{}}
	for _, iss := range cfg.Issuers {
		v.issuers[iss] = &issuer{id: iss}
	}
	return v, nil
}

// Resource is the resource the verifier accepts tokens for.
func (v *Verifier) Resource() string { return v.cfg.Resource }

// MetadataPath is where the protected resource metadata is served: the
// well-known prefix before the resource's path (RFC 9728 section 3.1).
func (v *Verifier) MetadataPath() string {
	u, _ := url.Parse(v.cfg.Resource)
	return "/.well-known/oauth-protected-resource" + strings.TrimSuffix(u.Path, "/")
}

// MetadataURL is the metadata's URL, as a 401 names it.
func (v *Verifier) MetadataURL() string {
	u, _ := url.Parse(v.cfg.Resource)
	return u.Scheme + "://" + u.Host + v.MetadataPath()
}

// Metadata is the protected resource metadata (RFC 9728).
func (v *Verifier) Metadata() *oauthex.ProtectedResourceMetadata {
	return &oauthex.ProtectedResourceMetadata{Resource: v.cfg.Resource, AuthorizationServers: v.cfg.Issuers,
		ScopesSupported: v.cfg.Scopes, BearerMethodsSupported: []string{"header"}, ResourceName: "arap MCP gateway"}
}

// MetadataHandler serves Metadata.
func (v *Verifier) MetadataHandler() http.Handler {
	return auth.ProtectedResourceMetadataHandler(v.Metadata())
}

// Challenge is the WWW-Authenticate value of a refusal for err (nil: no
// token was given).
func (v *Verifier) Challenge(err error) string {
	c := `Bearer resource_metadata="` + v.MetadataURL() + `"`
	if len(v.cfg.Scopes) > 0 {
		c += `, scope="` + strings.Join(v.cfg.Scopes, " ") + `"`
	}
	switch {
	case errors.Is(err, ErrInsufficientScope):
		c += `, error="insufficient_scope"`
	case err != nil:
		c += `, error="invalid_token"`
	}
	return c
}

// LooksLikeJWT reports whether token has the form of a compact JWS.
func LooksLikeJWT(token string) bool { return strings.Count(token, ".") == 2 }

// Verify checks token and returns who it speaks for.
func (v *Verifier) Verify(ctx context.Context, token string) (*Identity, error) {
	if len(token) > MaxToken {
		return nil, fmt.Errorf("%w: the token is longer than %d bytes", ErrInvalidToken, MaxToken)
	}
	var id *Identity
	var err error
	if LooksLikeJWT(token) {
		id, err = v.verifyJWT(ctx, token)
	} else {
		id, err = v.introspect(ctx, token)
	}
	if err != nil {
		return nil, err
	}
	for _, s := range v.cfg.Scopes {
		if !slices.Contains(id.Scopes, s) {
			return nil, fmt.Errorf("%w: the token lacks scope %q", ErrInsufficientScope, s)
		}
	}
	return id, nil
}

func (v *Verifier) verifyJWT(ctx context.Context, token string) (*Identity, error) {
	var peek jwt.RegisteredClaims
	if _, _, err := jwt.NewParser().ParseUnverified(token, &peek); err != nil {
		return nil, fmt.Errorf("%w: not a JWT: %v", ErrInvalidToken, err)
	}
	iss := v.issuers[peek.Issuer]
	if iss == nil {
		return nil, fmt.Errorf("%w: issuer %q is not trusted here", ErrInvalidToken, clip(peek.Issuer))
	}
	keys, err := v.keysOf(ctx, iss)
	if err != nil {
		return nil, fmt.Errorf("%w: the keys of issuer %s cannot be had: %v", ErrInvalidToken, iss.id, err)
	}
	claims := jwt.MapClaims{}
	parsed, err := jwt.ParseWithClaims(token, claims, keys.KeyfuncCtx(ctx), jwt.WithValidMethods(algs), jwt.WithIssuer(iss.id),
		jwt.WithAudience(v.cfg.Resource), jwt.WithExpirationRequired(), jwt.WithLeeway(v.cfg.Skew), jwt.WithIssuedAt(),
		jwt.WithTimeFunc(v.cfg.Now))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidToken, err)
	}
	if typ, ok := parsed.Header["typ"]; ok {
		t, _ := typ.(string)
		if !slices.Contains([]string{"at+jwt", "application/at+jwt", "jwt"}, strings.ToLower(t)) {
			return nil, fmt.Errorf("%w: a token of type %q is not an access token", ErrInvalidToken, clip(t))
		}
	}
	return v.identity(iss.id, claims)
}

// keysOf returns iss's keys, finding its metadata first if need be.
func (v *Verifier) keysOf(ctx context.Context, iss *issuer) (keyfunc.Keyfunc, error) {
	if _, err := v.metaOf(ctx, iss); err != nil {
		return nil, err
	}
	iss.mu.Lock()
	defer iss.mu.Unlock()
	if iss.keys != nil {
		return iss.keys, nil
	}
	if iss.meta.JWKSURI == "" {
		return nil, errors.New("its metadata names no jwks_uri")
	}
	// The keys are refreshed for the process's life (the background
	// context): every hour, and at once, rate-limited, for an unknown key.
	k, err := keyfunc.NewDefaultOverrideCtx(context.Background(), []string{iss.meta.JWKSURI}, keyfunc.Override{
		Client: v.cfg.HTTP, HTTPTimeout: 5 * time.Second, RefreshUnknownKID: rate.NewLimiter(rate.Every(unknownKID), 1),
		// jwkset bounds both the wait for the limiter and the refetch itself
		// by this one deadline, so it is the fetch's own timeout (1 ms
		// failed the refetch on a busy machine); a flood still costs one
		// refetch per unknownKID, as a wait longer than the deadline is
		// refused at once.
		RateLimitWaitMax: 5 * time.Second, RefreshErrorHandlerFunc: func(string) func(context.Context, error) {
			return func(context.Context, error) {} // a token that needs the keys says why it was refused
		},
	})
	if err != nil {
		return nil, err
	}
	iss.keys = k
	return k, nil
}

// metaOf returns iss's metadata, fetched on first use; after a failure it
// is not fetched again for retryDiscovery, and the failure stands.
func (v *Verifier) metaOf(ctx context.Context, iss *issuer) (*oauthex.AuthServerMeta, error) {
	iss.mu.Lock()
	defer iss.mu.Unlock()
	if iss.meta != nil {
		return iss.meta, nil
	}
	if iss.failedErr != nil && v.cfg.Now().Sub(iss.failedAt) < retryDiscovery {
		return nil, iss.failedErr
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	meta, err := auth.GetAuthServerMetadata(ctx, iss.id, v.cfg.HTTP)
	if err == nil && meta == nil {
		err = errors.New("it publishes no authorization server metadata")
	}
	if err != nil {
		iss.failedAt, iss.failedErr = v.cfg.Now(), fmt.Errorf("metadata of %s: %w", iss.id, err)
		return nil, iss.failedErr
	}
	iss.meta = meta
	return meta, nil
}

// introspect verifies an opaque token at the issuers' introspection
// endpoints (RFC 7662), each in turn, as Config.Introspect.
func (v *Verifier) introspect(ctx context.Context, token string) (*Identity, error) {
	if v.cfg.Introspect == nil {
		return nil, fmt.Errorf("%w: not a JWT, and opaque tokens are not introspected here", ErrInvalidToken)
	}
	var last error
	for _, id := range v.cfg.Issuers {
		iss := v.issuers[id]
		meta, err := v.metaOf(ctx, iss)
		if err != nil {
			last = err
			continue
		}
		if meta.IntrospectionEndpoint == "" {
			continue
		}
		claims, err := v.askIntrospection(ctx, meta.IntrospectionEndpoint, token)
		if err != nil {
			last = err
			continue
		}
		if active, _ := claims["active"].(bool); !active {
			continue // not this issuer's, or no longer valid
		}
		if s, _ := claims["iss"].(string); s != "" && s != id {
			return nil, fmt.Errorf("%w: the introspected token's issuer %q is not %s", ErrInvalidToken, clip(s), id)
		}
		var c jwt.MapClaims = claims
		if aud, err := c.GetAudience(); err != nil || !slices.Contains(aud, v.cfg.Resource) {
			return nil, fmt.Errorf("%w: the token is not for this resource (its audience does not name %s)", ErrInvalidToken, v.cfg.Resource)
		}
		if exp, err := c.GetExpirationTime(); err != nil || exp == nil || !v.cfg.Now().Before(exp.Add(v.cfg.Skew)) {
			return nil, fmt.Errorf("%w: the token has expired or names no expiry", ErrInvalidToken)
		}
		return v.identity(id, claims)
	}
	if last != nil {
		return nil, fmt.Errorf("%w: introspection failed: %v", ErrInvalidToken, last)
	}
	return nil, fmt.Errorf("%w: the token is not active at any trusted issuer", ErrInvalidToken)
}

func (v *Verifier) askIntrospection(ctx context.Context, endpoint, token string) (map[string]any, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(url.Values{"token": {token}}.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	req.SetBasicAuth(url.QueryEscape(v.cfg.Introspect.ID), url.QueryEscape(v.cfg.Introspect.Secret))
	resp, err := v.cfg.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("introspection answered %d", resp.StatusCode)
	}
	var claims map[string]any
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&claims); err != nil {
		return nil, fmt.Errorf("introspection answered no JSON object: %v", err)
	}
	return claims, nil
}

// identity reads the verified claims of a token of issuer iss.
func (v *Verifier) identity(iss string, claims map[string]any) (*Identity, error) {
	sub, _ := claims[v.cfg.SubjectClaim].(string)
	if err := identity.Check(sub); err != nil {
		return nil, fmt.Errorf("%w: its subject (%s) %v", ErrInvalidToken, v.cfg.SubjectClaim, err)
	}
	id := &Identity{Issuer: iss, Subject: sub}
	if act, ok := claims["act"]; ok {
		actors, err := authzen.ActorChain(act, "sub", "act")
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidToken, err)
		}
		for _, a := range actors {
			if err := identity.Check(a); err != nil {
				return nil, fmt.Errorf("%w: actor %q %v", ErrInvalidToken, clip(a), err)
			}
		}
		id.Actors = actors
	}
	id.ClientID, _ = claims["client_id"].(string)
	if id.ClientID == "" {
		id.ClientID, _ = claims["azp"].(string)
	}
	switch s := claims["scope"].(type) {
	case string:
		id.Scopes = strings.Fields(s)
	}
	if scp, ok := claims["scp"].([]any); ok {
		for _, s := range scp {
			if str, ok := s.(string); ok {
				id.Scopes = append(id.Scopes, str)
			}
		}
	}
	var c jwt.MapClaims = claims
	if exp, err := c.GetExpirationTime(); err == nil && exp != nil {
		id.Expiry = exp.Time
	}
	return id, nil
}

// clip bounds text from a token that goes into an error.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
