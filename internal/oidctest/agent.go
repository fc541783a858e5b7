package oidctest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// The agents' client: it gets JWT access tokens (RFC 9068) by the code
// flow and by token exchange (RFC 8693), which adds the act claim of
// delegation.
const (
	AgentClientID     = "mcp-agent"
	AgentClientSecret = "mcp-agent-secret"
	AgentRedirect     = "http://127.0.0.1/agent-callback"
)

// UserToken signs username in through the code flow, headless (the login
// form posted as a browser would), as the agents' client, and returns the
// access token: a JWT whose audience is the client.
func (o *OP) UserToken(t testing.TB, username, password string) string {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, CheckRedirect: func(r *http.Request, _ []*http.Request) error {
		if strings.HasPrefix(r.URL.String(), AgentRedirect) {
			return http.ErrUseLastResponse
		}
		return nil
	}}
	auth := o.Issuer + "/authorize?" + url.Values{"client_id": {AgentClientID}, "redirect_uri": {AgentRedirect}, "response_type": {"code"},
		"scope": {"openid"}, "state": {"s"}}.Encode()
	resp, err := c.Get(auth)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	id := resp.Request.URL.Query().Get("authRequestID")
	if id == "" {
		t.Fatalf("no login page: %s", resp.Request.URL)
	}
	resp, err = c.PostForm(o.Issuer+"/login/username", url.Values{"id": {id}, "username": {username}, "password": {password}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil || loc.Query().Get("code") == "" {
		t.Fatalf("no code in the redirect (%d %q)", resp.StatusCode, resp.Header.Get("Location"))
	}
	return o.token(t, url.Values{"grant_type": {"authorization_code"}, "code": {loc.Query().Get("code")}, "redirect_uri": {AgentRedirect}})
}

// Exchange asks the token endpoint for an access token for audience that
// speaks for subjectToken's subject through actorToken's (RFC 8693
// delegation): its act claim names the actor, with the actor token's own
// act claim nested under it.
func (o *OP) Exchange(t testing.TB, subjectToken, actorToken, audience string) string {
	t.Helper()
	v := url.Values{"grant_type": {string(oidc.GrantTypeTokenExchange)}, "subject_token": {subjectToken},
		"subject_token_type": {string(oidc.AccessTokenType)}, "requested_token_type": {string(oidc.AccessTokenType)},
		"audience": {audience}, "scope": {"openid mcp"}}
	if actorToken != "" {
		v.Set("actor_token", actorToken)
		v.Set("actor_token_type", string(oidc.AccessTokenType))
	}
	return o.token(t, v)
}

func (o *OP) token(t testing.TB, form url.Values) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, o.Issuer+"/oauth/token", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(AgentClientID, AgentClientSecret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var out struct {
		AccessToken string `json:"access_token"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &out) != nil || out.AccessToken == "" {
		t.Fatalf("token endpoint: %d %s", resp.StatusCode, body)
	}
	return out.AccessToken
}

// GetPrivateClaimsFromTokenExchangeRequest adds the granted scopes and the
// delegation's act claim
// (RFC 8693 section 4.1): the actor token's subject, and under it the
// actor token's own act claim, so chains nest.
func (s *store) GetPrivateClaimsFromTokenExchangeRequest(ctx context.Context, req op.TokenExchangeRequest) (map[string]any, error) {
	claims, err := s.Storage.GetPrivateClaimsFromTokenExchangeRequest(ctx, req)
	if err != nil {
		return nil, err
	}
	if claims == nil {
		claims = map[string]any{}
	}
	// RFC 9068 section 2.2.3: the granted scopes, which the op package
	// leaves out of JWT access tokens.
	claims["scope"] = strings.Join(req.GetScopes(), " ")
	if actor := req.GetExchangeActor(); actor != "" {
		act := map[string]any{"sub": actor}
		if prior, ok := req.GetExchangeActorTokenClaims()["act"]; ok {
			act["act"] = prior
		}
		claims["act"] = act
	}
	return claims, nil
}

// signingKey is one of the provider's keys (RS256).
type signingKey struct {
	id  string
	key *rsa.PrivateKey
}

func (k *signingKey) SignatureAlgorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k *signingKey) Key() any                                    { return k.key }
func (k *signingKey) ID() string                                  { return k.id }

type publicKey struct{ *signingKey }

func (k publicKey) Algorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k publicKey) Use() string                        { return "sig" }
func (k publicKey) Key() any                           { return &k.key.PublicKey }

// RotateKey makes a new signing key current; the old ones stay published.
func (o *OP) RotateKey() string {
	o.rotateKey()
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.keys[len(o.keys)-1].id
}

func (o *OP) rotateKey() {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.keys = append(o.keys, &signingKey{id: fmt.Sprintf("key-%d", len(o.keys)+1), key: k})
}

func (s *store) SigningKey(context.Context) (op.SigningKey, error) {
	s.op.mu.Lock()
	defer s.op.mu.Unlock()
	return s.op.keys[len(s.op.keys)-1], nil
}

func (s *store) SignatureAlgorithms(context.Context) ([]jose.SignatureAlgorithm, error) {
	return []jose.SignatureAlgorithm{jose.RS256}, nil
}

func (s *store) KeySet(context.Context) ([]op.Key, error) {
	s.op.mu.Lock()
	defer s.op.mu.Unlock()
	keys := make([]op.Key, len(s.op.keys))
	for i, k := range s.op.keys {
		keys[i] = publicKey{k}
	}
	return keys, nil
}

// ValidateTokenExchangeRequest allows a subject's own token to be exchanged
// for another audience without an actor (audience narrowing, not
// impersonation: the token speaks for the same subject); with an actor, as
// the example storage does.
func (s *store) ValidateTokenExchangeRequest(ctx context.Context, req op.TokenExchangeRequest) error {
	if req.GetExchangeActor() != "" {
		return s.Storage.ValidateTokenExchangeRequest(ctx, req)
	}
	if req.GetRequestedTokenType() == "" {
		req.SetRequestedTokenType(oidc.AccessTokenType)
	}
	req.SetCurrentScopes(req.GetScopes())
	return nil
}
