package sso_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/oidctest"
	"github.com/omcp/arap/sso"
)

// issuer is a provider on loopback whose token endpoint answers with an ID
// token of the test's claims, signed with the key its JWKS publishes: the
// in-test provider (oidctest) always sets azp to the client, so it cannot
// mint the tokens these tests need.
type issuer struct {
	URL    string
	key    *ecdsa.PrivateKey
	mu     sync.Mutex
	claims map[string]any
}

func startIssuer(t *testing.T) *issuer {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	is := &issuer{key: k}
	srv := httptest.NewServer(http.HandlerFunc(is.serve))
	t.Cleanup(srv.Close)
	is.URL = srv.URL
	return is
}

// next sets the claims of the ID token the token endpoint answers with.
func (is *issuer) next(claims map[string]any) {
	is.mu.Lock()
	defer is.mu.Unlock()
	is.claims = claims
}

func (is *issuer) serve(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/.well-known/openid-configuration":
		_ = json.NewEncoder(w).Encode(map[string]any{"issuer": is.URL, "authorization_endpoint": is.URL + "/authorize",
			"token_endpoint": is.URL + "/token", "jwks_uri": is.URL + "/keys", "id_token_signing_alg_values_supported": []string{"ES256"}})
	case "/keys":
		_ = json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{
			{Key: &is.key.PublicKey, KeyID: "k1", Algorithm: string(jose.ES256), Use: "sig"}}})
	case "/token":
		if r.Method != http.MethodPost || r.FormValue("code") != "the-code" {
			http.Error(w, `{"error":"invalid_grant"}`, http.StatusBadRequest)
			return
		}
		is.mu.Lock()
		payload, err := json.Marshal(is.claims)
		is.mu.Unlock()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: jose.JSONWebKey{Key: is.key, KeyID: "k1"}},
			(&jose.SignerOptions{}).WithType("JWT"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		jws, err := signer.Sign(payload)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		raw, _ := jws.CompactSerialize()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"access_token": "opaque", "token_type": "Bearer", "expires_in": 3600, "id_token": raw})
	default:
		http.NotFound(w, r)
	}
}

// TestCallbackAuthorizedParty: the authorized party (azp) is the client the
// ID token was issued to. With several audiences it must be present and be
// us; with one, an azp naming another client is refused too. The token is
// otherwise valid (signature, issuer, audience including us, expiry,
// nonce), so only the azp check stands between it and a session.
func TestCallbackAuthorizedParty(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	is := startIssuer(t)
	rp, err := sso.New(ctx, config(is.URL))
	require.NoError(t, err)
	const us, other = oidctest.ClientID, "another-client"
	for _, tc := range []struct {
		name string
		aud  any
		azp  string // "" for none
		want string // the refused check, "" to accept
	}{
		{"several audiences, azp us", []string{us, other}, us, ""},
		{"several audiences, azp another client", []string{us, other}, other, sso.CheckAZP},
		{"several audiences, no azp", []string{us, other}, "", sso.CheckAZP},
		{"one audience, azp another client", us, other, sso.CheckAZP},
		{"one audience, azp us", us, us, ""},
		{"one audience, no azp", us, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claims := map[string]any{"iss": is.URL, "sub": "u-123", "aud": tc.aud, "nonce": "the-nonce",
				"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix(), "preferred_username": "bob"}
			if tc.azp != "" {
				claims["azp"] = tc.azp
			}
			is.next(claims)
			id, err := rp.Callback(ctx, "the-code", "the-verifier-the-verifier-the-verifier-1234", "the-nonce")
			if tc.want == "" {
				require.NoError(t, err)
				require.Equal(t, "u-123", id.Subject)
				require.Equal(t, "bob", id.PreferredUsername)
				return
			}
			require.Nil(t, id)
			var ce *sso.CheckError
			require.True(t, errors.As(err, &ce), "%v", err)
			require.Equal(t, tc.want, ce.Check, "%v", err)
		})
	}
}
