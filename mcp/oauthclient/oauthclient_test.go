package oauthclient

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/oauth2"
)

// TestTokensKeptBetweenRuns: a run starts from the token a previous run
// kept (no sign-in), refreshes it when it expires and keeps the new one;
// the file is its owner's alone (0600), and holds each server's apart.
func TestTokensKeptBetweenRuns(t *testing.T) {
	var refreshes atomic.Int32
	as := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.NoError(t, r.ParseForm())
		require.Equal(t, "refresh_token", r.Form.Get("grant_type"))
		require.Equal(t, "r1", r.Form.Get("refresh_token"))
		refreshes.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"access_token": "a2", "token_type": "Bearer", "refresh_token": "r2", "expires_in": 3600})
	}))
	defer as.Close()
	path := filepath.Join(t.TempDir(), "state", "oauth.json")
	s := &store{path: path, server: "https://mcp.test/mcp"}
	require.NoError(t, s.save(saved{ClientID: "c", TokenURL: as.URL, Token: &oauth2.Token{AccessToken: "a1", RefreshToken: "r1", TokenType: "Bearer",
		Expiry: time.Now().Add(-time.Minute)}, Scopes: []string{"mcp"}}))
	require.NoError(t, (&store{path: path, server: "https://other.test/mcp"}).save(saved{ClientID: "o", Token: &oauth2.Token{AccessToken: "x"}}))
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	h, err := New(Config{Server: "https://mcp.test/mcp", Store: path, HTTP: as.Client()})
	require.NoError(t, err)
	ts, err := h.TokenSource(context.Background())
	require.NoError(t, err)
	require.NotNil(t, ts, "the kept token is used: no sign-in")
	tok, err := ts.Token()
	require.NoError(t, err)
	require.Equal(t, "a2", tok.AccessToken, "refreshed, the old one having expired")
	require.EqualValues(t, 1, refreshes.Load())

	kept, err := s.load()
	require.NoError(t, err)
	require.Equal(t, "a2", kept.Token.AccessToken)
	require.Equal(t, "r2", kept.Token.RefreshToken, "the new refresh token is kept for the next run")
	other, err := (&store{path: path, server: "https://other.test/mcp"}).load()
	require.NoError(t, err)
	require.Equal(t, "x", other.Token.AccessToken, "another server's tokens are untouched")
	fi, err = os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "still its owner's alone after a rewrite")
}
