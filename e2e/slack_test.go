package e2e

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
)

// TestSlackServe: `arapd serve` with the Slack flags and environment (the
// token from a file, the signing secret from the environment, the API URL
// of a local Slack Web API) messages the treasury approvers, records a
// signed Approve as the person through channel slack, updates the
// messages, and never logs the token or the secret.
func TestSlackServe(t *testing.T) {
	t.Parallel()
	const (
		botToken = "xoxb-e2e-0123456789-token"
		secret   = "e2e-signing-secret-9876543210"
	)
	var mu sync.Mutex
	var calls []string // "method channel"
	emails := map[string]string{"bob@example.com": "UBOB", "carol@example.com": "UCAROL"}
	slackAPI := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		method := strings.TrimPrefix(r.URL.Path, "/api/")
		if r.Header.Get("Authorization") != "Bearer "+botToken && r.Form.Get("token") != botToken {
			_ = json.NewEncoder(w).Encode(map[string]any{"ok": false, "error": "invalid_auth"})
			return
		}
		mu.Lock()
		calls = append(calls, method+" "+r.Form.Get("channel"))
		n := len(calls)
		mu.Unlock()
		user := func(id, email string) map[string]any {
			return map[string]any{"ok": true, "user": map[string]any{"id": id, "is_email_confirmed": true, "profile": map[string]any{"email": email}}}
		}
		var out map[string]any
		switch method {
		case "users.lookupByEmail":
			out = user(emails[r.Form.Get("email")], r.Form.Get("email"))
		case "users.info":
			out = user(r.Form.Get("user"), "bob@example.com")
		case "chat.postMessage":
			out = map[string]any{"ok": true, "channel": "D" + r.Form.Get("channel"), "ts": fmt.Sprintf("1700000000.%06d", n)}
		case "chat.update":
			out = map[string]any{"ok": true, "channel": r.Form.Get("channel"), "ts": r.Form.Get("ts")}
		case "chat.postEphemeral":
			out = map[string]any{"ok": true, "message_ts": "1700000000.999999"}
		}
		_ = json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(slackAPI.Close)
	count := func(prefix string) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, c := range calls {
			if strings.HasPrefix(c, prefix) {
				n++
			}
		}
		return n
	}

	dbURL := dbtest.URL(t)
	tokenFile := filepath.Join(t.TempDir(), "slack-token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(botToken+"\n"), 0o600))
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	require.NoError(t, os.WriteFile(policy, dev.SeedPolicy(), 0o600))
	env := []string{"DATABASE_URL=" + dbURL, "ARAP_MASTER_KEY=" + masterKey,
		"ARAP_SLACK_SIGNING_SECRET=" + secret, "ARAP_SLACK_API_URL=" + slackAPI.URL + "/api"}
	pep := token(arapctl(t, env, "clients", "create", "--name", "pep", "--scope", "evaluate,request", "--actor", "agent:*"))
	for _, u := range []string{"alice", "bob", "carol"} {
		arapctl(t, env, "users", "create", "--name", u, "--email", u+"@example.com")
	}
	arapctl(t, env, "groups", "create", "treasury")
	arapctl(t, env, "groups", "add", "treasury", "bob")
	arapctl(t, env, "groups", "add", "treasury", "carol")
	p := startArapd(t, env, "serve", "--addr", "127.0.0.1:0", "--policy", policy, "--slack-token-file", tokenFile)

	id := request(t, p.url(), p.url(), pep, toolCall("wire_transfer", map[string]any{"to": "acct-991", "amount": 50000}))
	require.Eventually(t, func() bool { return count("chat.postMessage") == 2 }, 30*time.Second, 50*time.Millisecond)

	payload, _ := json.Marshal(map[string]any{"type": "block_actions", "user": map[string]any{"id": "UBOB"}, "channel": map[string]any{"id": "DUBOB"},
		"actions": []any{map[string]any{"type": "button", "block_id": "arap_decide", "action_id": "arap_approve", "value": id}}})
	body := url.Values{"payload": {string(payload)}}.Encode()
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte("v0:" + ts + ":" + body))
	req, _ := http.NewRequest("POST", p.url()+"/slack/interactivity", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Slack-Request-Timestamp", ts)
	req.Header.Set("X-Slack-Signature", "v0="+hex.EncodeToString(mac.Sum(nil)))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)

	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var voter, kind, channel, status string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT v.voter, v.voter_kind, v.channel, r.status FROM arap.votes v
		JOIN arap.requests r ON r.id = v.request_id WHERE v.request_id = $1`, id).Scan(&voter, &kind, &channel, &status))
	require.Equal(t, []string{"user:bob", "human", "slack", "approved"}, []string{voter, kind, channel, status})
	require.Eventually(t, func() bool { return count("chat.update") == 2 }, 30*time.Second, 50*time.Millisecond,
		"both approvers' messages show the outcome")

	p.flush()
	for _, line := range p.logLines() {
		require.NotContains(t, line, botToken)
		require.NotContains(t, line, secret)
	}
}
