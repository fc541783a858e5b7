package agentauth_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/agentauth"
	"github.com/omcp/arap/internal/oidctest"
)

const resource = "https://mcp.example.test/mcp"

// setup runs a real provider (zitadel's op, internal/oidctest) with alice,
// the agent acting for her and an orchestrator above the agent.
func setup(t *testing.T) (*oidctest.OP, func(agentauth.Config) *agentauth.Verifier) {
	t.Helper()
	op := oidctest.Start(t)
	for _, u := range []oidctest.User{
		{ID: "alice", Username: "alice", Password: "pw-alice", Email: "alice@example.test", EmailVerified: true},
		{ID: "agent:demo", Username: "agent", Password: "pw-agent"},
		{ID: "agent:orchestrator", Username: "orchestrator", Password: "pw-orch"},
	} {
		op.Put(u)
	}
	return op, func(c agentauth.Config) *agentauth.Verifier {
		if c.Resource == "" {
			c.Resource = resource
		}
		if c.Issuers == nil {
			c.Issuers = []string{op.Issuer}
		}
		v, err := agentauth.New(c)
		require.NoError(t, err)
		return v
	}
}

// TestTokenExchangeActorChain (issue 33): an access token the provider
// made by token exchange speaks for its subject through the actors of its
// act claim, nested as deep as the exchanges went; the client it was issued
// to comes along.
func TestTokenExchangeActorChain(t *testing.T) {
	t.Parallel()
	op, verifier := setup(t)
	v := verifier(agentauth.Config{})
	ctx := context.Background()
	alice, agent := op.UserToken(t, "alice", "pw-alice"), op.UserToken(t, "agent", "pw-agent")

	id, err := v.Verify(ctx, op.Exchange(t, alice, agent, resource))
	require.NoError(t, err)
	require.Equal(t, "alice", id.Subject)
	require.Equal(t, []string{"agent:demo"}, id.Actors)
	require.Equal(t, oidctest.AgentClientID, id.ClientID)
	require.Equal(t, op.Issuer, id.Issuer)
	require.Contains(t, id.Scopes, "mcp")

	// The agent acting for the orchestrator, then for alice: two links.
	orchestrated := op.Exchange(t, agent, op.UserToken(t, "orchestrator", "pw-orch"), oidctest.AgentClientID)
	id, err = v.Verify(ctx, op.Exchange(t, alice, orchestrated, resource))
	require.NoError(t, err)
	require.Equal(t, []string{"agent:demo", "agent:orchestrator"}, id.Actors)

	// Without an actor: alice herself.
	id, err = v.Verify(ctx, op.Exchange(t, alice, "", resource))
	require.NoError(t, err)
	require.Empty(t, id.Actors)
}

// TestRefusedTokens: every token a resource must refuse is refused as
// invalid_token (401), with the reason, never an error of another kind.
func TestRefusedTokens(t *testing.T) {
	t.Parallel()
	op, verifier := setup(t)
	ctx := context.Background()
	v := verifier(agentauth.Config{})
	alice, agent := op.UserToken(t, "alice", "pw-alice"), op.UserToken(t, "agent", "pw-agent")
	good := op.Exchange(t, alice, agent, resource)
	header, payload, sig := split(t, good)

	forgedKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	foreign, err := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"iss": "https://elsewhere.test", "sub": "alice", "aud": resource,
		"exp": time.Now().Add(time.Hour).Unix()}).SignedString(forgedKey)
	require.NoError(t, err)
	none := b64(`{"alg":"none","typ":"JWT"}`) + "." + payload + "."
	// HS256 keyed with the provider's public key, the classic confusion.
	jwks := fetchJWKS(t, op.Issuer+"/keys")
	hs, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claimsOf(t, payload)).SignedString(jwks)
	require.NoError(t, err)
	var claims map[string]any
	require.NoError(t, json.Unmarshal(decode(t, payload), &claims))
	claims["aud"] = []string{"https://other.example.test/mcp"}
	reaud := header + "." + b64(mustJSON(t, claims)) + "." + sig // the signature no longer matches

	for name, c := range map[string]struct {
		token, want string
		v           *agentauth.Verifier
	}{
		"wrong audience":            {token: alice, want: "audience"},
		"audience rewritten":        {token: reaud, want: "signature"},
		"expired":                   {token: good, want: "expired", v: verifier(agentauth.Config{Now: func() time.Time { return time.Now().Add(3 * time.Hour) }})},
		"not yet valid":             {token: good, want: "", v: verifier(agentauth.Config{Now: func() time.Time { return time.Now().Add(-3 * time.Hour) }})},
		"unknown issuer":            {token: foreign, want: "not trusted"},
		"alg none":                  {token: none, want: "signing method"},
		"HS256 with the public key": {token: hs, want: "signing method"},
		"oversized":                 {token: strings.Repeat("a", agentauth.MaxToken+1), want: "longer than"},
		"not a JWT":                 {token: "opaque-token-value", want: "opaque tokens are not introspected"},
		"garbage":                   {token: "a.b.c", want: "not a JWT"},
	} {
		t.Run(name, func(t *testing.T) {
			vv := c.v
			if vv == nil {
				vv = v
			}
			_, err := vv.Verify(ctx, c.token)
			require.ErrorIs(t, err, agentauth.ErrInvalidToken)
			require.ErrorContains(t, err, c.want)
		})
	}

	// Short of a required scope: 403's insufficient_scope.
	_, err = verifier(agentauth.Config{Scopes: []string{"payments"}}).Verify(ctx, good)
	require.ErrorIs(t, err, agentauth.ErrInsufficientScope)
}

// TestKeyRotation: a token signed with a key the provider made after the
// verifier last read its keys is verified (the keys refetched for the
// unknown kid); a flood of unknown kids costs one refetch per interval.
func TestKeyRotation(t *testing.T) {
	t.Parallel()
	op, verifier := setup(t)
	ctx := context.Background()
	v := verifier(agentauth.Config{})
	alice, agent := op.UserToken(t, "alice", "pw-alice"), op.UserToken(t, "agent", "pw-agent")
	_, err := v.Verify(ctx, op.Exchange(t, alice, agent, resource))
	require.NoError(t, err)
	kid := op.RotateKey()
	rotated := op.Exchange(t, alice, agent, resource)
	h, _, _ := split(t, rotated)
	require.Contains(t, string(decode(t, h)), kid)
	_, err = v.Verify(ctx, rotated)
	require.NoError(t, err, "verified with the new key")
}

// TestBrokenIssuer: an issuer whose key endpoint hangs or answers garbage
// makes its tokens refused (401) in bounded time, never a panic or a 500.
func TestBrokenIssuer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, keys := range map[string]http.HandlerFunc{
		"hangs": func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() },
		"garbage": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"keys": [{"kty": "RSA", "n": "???"}`))
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var srv *httptest.Server
			srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/.well-known/oauth-authorization-server":
					w.Header().Set("Content-Type", "application/json")
					_ = json.NewEncoder(w).Encode(map[string]any{"issuer": srv.URL, "jwks_uri": srv.URL + "/keys",
						"authorization_endpoint": srv.URL + "/authorize", "token_endpoint": srv.URL + "/token",
						"code_challenge_methods_supported": []string{"S256"}, "response_types_supported": []string{"code"}})
				case "/keys":
					keys(w, r)
				default:
					http.NotFound(w, r)
				}
			}))
			defer srv.Close()
			key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			require.NoError(t, err)
			tok := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"iss": srv.URL, "sub": "alice", "aud": resource, "exp": time.Now().Add(time.Hour).Unix()})
			tok.Header["kid"] = "k1"
			signed, err := tok.SignedString(key)
			require.NoError(t, err)
			v, err := agentauth.New(agentauth.Config{Resource: resource, Issuers: []string{srv.URL}})
			require.NoError(t, err)
			_, err = v.Verify(ctx, signed)
			require.ErrorIs(t, err, agentauth.ErrInvalidToken)
		})
	}
}

func split(t *testing.T, token string) (string, string, string) {
	t.Helper()
	p := strings.Split(token, ".")
	require.Len(t, p, 3)
	return p[0], p[1], p[2]
}

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func decode(t *testing.T, s string) []byte {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(s)
	require.NoError(t, err)
	return b
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

func claimsOf(t *testing.T, payload string) jwt.MapClaims {
	t.Helper()
	var c jwt.MapClaims
	require.NoError(t, json.Unmarshal(decode(t, payload), &c))
	return c
}

// fetchJWKS is the provider's key set document, as bytes: what an attacker
// would use as an HMAC secret.
func fetchJWKS(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return b
}
