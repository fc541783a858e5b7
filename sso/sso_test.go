package sso_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/oidctest"
	"github.com/omcp/arap/sso"
)

func config(issuer string) sso.Config {
	return sso.Config{Issuer: issuer, ClientID: oidctest.ClientID, ClientSecret: oidctest.ClientSecret,
		RedirectURL: "http://127.0.0.1:8480/ui/oidc/callback"}
}

func TestAuthURL(t *testing.T) {
	t.Parallel()
	op := oidctest.Start(t)
	rp, err := sso.New(context.Background(), config(op.Issuer))
	require.NoError(t, err)
	require.Equal(t, sso.DefaultName, rp.Name())
	u, err := url.Parse(rp.AuthURL("the-state", "the-nonce", "the-verifier-the-verifier-the-verifier-1234"))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(u.String(), op.Issuer+"/authorize?"), u.String())
	q := u.Query()
	require.Equal(t, "code", q.Get("response_type"))
	require.Equal(t, oidctest.ClientID, q.Get("client_id"))
	require.Equal(t, "the-state", q.Get("state"))
	require.Equal(t, "the-nonce", q.Get("nonce"))
	require.Equal(t, "S256", q.Get("code_challenge_method"))
	require.NotEmpty(t, q.Get("code_challenge"))
	require.NotContains(t, u.String(), "the-verifier", "only the challenge leaves")
	require.Equal(t, "openid email profile", q.Get("scope"))
	require.Equal(t, "http://127.0.0.1:8480/ui/oidc/callback", q.Get("redirect_uri"))
}

// discovery serves a discovery document (with the server's own URL as
// issuer) edited by edit, and keys at /keys.
func discovery(t *testing.T, edit func(doc map[string]any), keys string) string {
	t.Helper()
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/.well-known/openid-configuration":
			doc := map[string]any{"issuer": srv.URL, "authorization_endpoint": srv.URL + "/authorize", "token_endpoint": srv.URL + "/token",
				"jwks_uri": srv.URL + "/keys", "id_token_signing_alg_values_supported": []string{"RS256"}}
			edit(doc)
			_ = json.NewEncoder(w).Encode(doc)
		case "/keys":
			if keys == "" {
				http.NotFound(w, r)
				return
			}
			_, _ = w.Write([]byte(keys))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestNewRefusesAMisconfiguredProvider(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	op := oidctest.Start(t)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := "http://" + l.Addr().String()
	require.NoError(t, l.Close())

	mismatch := strings.Replace(op.Issuer, "127.0.0.1", "localhost", 1)
	noJWKS := discovery(t, func(doc map[string]any) { delete(doc, "jwks_uri") }, "")
	noToken := discovery(t, func(doc map[string]any) { delete(doc, "token_endpoint") }, "")
	keys404 := discovery(t, func(map[string]any) {}, "")
	noKeys := discovery(t, func(map[string]any) {}, `{"keys":[]}`)
	notKeys := discovery(t, func(map[string]any) {}, `<html>`)

	for _, tc := range []struct {
		name string
		cfg  sso.Config
		want string
	}{
		{"unreachable", config(closed), "sso: issuer " + closed + ": discovery (" + closed + "/.well-known/openid-configuration): "},
		{"issuer mismatch", config(mismatch), "sso: issuer " + mismatch + `: the discovery document names issuer "` + op.Issuer + `"`},
		{"no jwks_uri", config(noJWKS), "sso: issuer " + noJWKS + ": the discovery document has no jwks_uri"},
		{"no token endpoint", config(noToken), "sso: issuer " + noToken + ": the discovery document has no token_endpoint"},
		{"JWKS not found", config(keys404), "sso: issuer " + keys404 + ": JWKS " + keys404 + "/keys: answered 404 Not Found"},
		{"JWKS empty", config(noKeys), "sso: issuer " + noKeys + ": JWKS " + noKeys + "/keys: holds no signing key"},
		{"JWKS not JSON", config(notKeys), "sso: issuer " + notKeys + ": JWKS " + notKeys + "/keys: not a JSON Web Key Set"},
		{"plain http elsewhere", config("http://idp.example.com"), `sso: issuer "http://idp.example.com" must be an https URL (http only on loopback)`},
		{"no issuer", config(""), "sso: an issuer URL is required (--oidc-issuer)"},
		{"no client id", func() sso.Config { c := config(op.Issuer); c.ClientID = ""; return c }(), "sso: issuer " + op.Issuer + ": a client id is required"},
		{"no secret", func() sso.Config { c := config(op.Issuer); c.ClientSecret = ""; return c }(), "sso: issuer " + op.Issuer + ": a client secret is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sso.New(ctx, tc.cfg)
			require.ErrorContains(t, err, tc.want)
		})
	}
}
