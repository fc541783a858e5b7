package webui_test

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/passkeys/passkeytest"
)

// passkeyPolicy is the dev policy with wire_transfer_large requiring a
// signed decision.
func passkeyPolicy(t *testing.T) []byte {
	p := strings.Replace(string(dev.SeedPolicy()), "      approved_for: 1h\n", "      approved_for: 1h\n      require_passkey: true\n", 1)
	require.Contains(t, p, "require_passkey")
	return []byte(p)
}

func (b *browser) postJSON(path string, form url.Values) (int, map[string]any) {
	b.t.Helper()
	p := b.post(path, form)
	var out map[string]any
	require.NoError(b.t, json.Unmarshal([]byte(p.body), &out), "%d %s", p.status, p.body)
	return p.status, out
}

// TestPasskeySignedDecision: on a rule requiring a signed decision, the
// page tells a person without a passkey to register one and offers no
// buttons; a registered passkey signs the options the server derives; an
// unsigned post, a ceremony begun for the other decision, and a used
// ceremony are refused; the signed approval is recorded.
func TestPasskeySignedDecision(t *testing.T) {
	t.Parallel()
	env := backendtest.Start(t, backendtest.Options{Policy: passkeyPolicy(t)})
	u, err := url.Parse(env.URL)
	require.NoError(t, err)
	key := passkeytest.New("localhost", "http://localhost:"+u.Port())
	id := env.Submit(t, wireCall("alice", 50000))
	b := newBrowser(t, env.URL)
	require.Equal(t, http.StatusSeeOther, b.signIn("bob", dev.Password).status)

	p := b.get("/ui/requests/" + id)
	require.Equal(t, 200, p.status)
	require.Contains(t, p.body, `id="passkey-needed"`)
	require.Contains(t, p.body, "you have none registered")
	require.NotContains(t, p.body, `id="approve"`)
	token := csrf(t, p)
	status, out := b.postJSON("/ui/requests/"+id+"/challenge", url.Values{"decision": {"approve"}})
	require.Equal(t, 403, status, "CSRF-checked: %v", out)
	status, out = b.postJSON("/ui/requests/"+id+"/challenge", url.Values{"csrf": {token}, "decision": {"approve"}})
	require.Equal(t, 409, status)
	require.Contains(t, out["error"], "You have no passkey registered")

	// Register, as passkeys.js does.
	status, out = b.postJSON("/ui/passkeys/register", url.Values{"csrf": {token}})
	require.Equal(t, 200, status, "%v", out)
	opts, _ := json.Marshal(out["options"])
	status, out = b.postJSON("/ui/passkeys/register/finish", url.Values{"csrf": {token}, "ceremony": {out["ceremony"].(string)},
		"name": {"test key"}, "credential": {string(key.Register(opts))}})
	require.Equal(t, 200, status, "%v", out)
	require.Contains(t, b.get("/ui/passkeys").body, "test key")

	p = b.get("/ui/requests/" + id)
	require.Contains(t, p.body, `id="passkey-note"`)
	require.Contains(t, p.body, `data-passkey="/ui/requests/`+id+`/challenge"`)
	require.Contains(t, p.body, `id="approve"`)

	// Unsigned (a stolen session, or no script): refused.
	p = b.post("/ui/requests/"+id+"/decide", url.Values{"csrf": {token}, "decision": {"approve"}})
	require.Equal(t, 403, p.status)
	require.Contains(t, p.body, "requires a decision signed with your passkey, and this one is not signed")

	sign := func(decision, until string) (string, string) {
		status, out := b.postJSON("/ui/requests/"+id+"/challenge", url.Values{"csrf": {token}, "decision": {decision}, "until": {until}})
		require.Equal(t, 200, status, "%v", out)
		var o struct {
			PublicKey struct {
				Challenge string `json:"challenge"`
			} `json:"publicKey"`
		}
		raw, _ := json.Marshal(out["options"])
		require.NoError(t, json.Unmarshal(raw, &o))
		challenge, err := base64URL(o.PublicKey.Challenge)
		require.NoError(t, err)
		a, _ := json.Marshal(key.Sign(challenge))
		return out["ceremony"].(string), string(a)
	}
	// A ceremony begun for a deny cannot carry an approve.
	ceremony, a := sign("deny", "")
	p = b.post("/ui/requests/"+id+"/decide", url.Values{"csrf": {token}, "decision": {"approve"}, "ceremony": {ceremony}, "assertion": {a}})
	require.Equal(t, 400, p.status)
	require.Contains(t, p.body, "the signature was made for another decision")

	// What is signed is the validity the page showed; one that has passed,
	// or is longer than the request can have, is an out-of-date page.
	shown := regexp.MustCompile(`id="approval-until" datetime="([^"]+)"`).FindStringSubmatch(b.get("/ui/requests/" + id).body)
	require.NotNil(t, shown, "the page shows the approval's validity")
	shownAt, err := time.Parse(time.RFC3339, shown[1])
	require.NoError(t, err)
	for _, stale := range []string{shownAt.Add(-2 * time.Hour).Format(time.RFC3339), shownAt.Add(time.Hour).Format(time.RFC3339), "tomorrow"} {
		status, out := b.postJSON("/ui/requests/"+id+"/challenge", url.Values{"csrf": {token}, "decision": {"approve"}, "until": {stale}})
		require.Equal(t, http.StatusConflict, status, "%s: %v", stale, out)
		require.Contains(t, out["error"], "out of date")
	}
	ceremony, a = sign("approve", shown[1])
	form := url.Values{"csrf": {token}, "decision": {"approve"}, "ceremony": {ceremony}, "assertion": {a}, "reason": {"ok"}}
	p = b.post("/ui/requests/"+id+"/decide", form)
	require.Equal(t, http.StatusSeeOther, p.status, p.body)
	var recorded time.Time
	require.NoError(t, env.Pool.QueryRow(t.Context(), `SELECT approved_until FROM arap.votes WHERE request_id = $1`, id).Scan(&recorded))
	require.True(t, recorded.Equal(shownAt), "the vote's window is the one shown: %s, shown %s", recorded, shownAt)
	require.Equal(t, "/ui/?done=approve", p.location)
	p = b.post("/ui/requests/"+id+"/decide", form)
	require.Equal(t, 400, p.status, "a ceremony is used once")
	require.Contains(t, p.body, "expired or was already used")

	// Another passkey needs one of bob's to approve it: his session alone
	// (a stolen cookie) cannot enrol a key.
	other := passkeytest.New("localhost", "http://localhost:"+u.Port())
	status, out = b.postJSON("/ui/passkeys/register", url.Values{"csrf": {token}})
	require.Equal(t, 200, status, "%v", out)
	require.NotNil(t, out["step_up"], "a step-up is asked for")
	opts, _ = json.Marshal(out["options"])
	status, out = b.postJSON("/ui/passkeys/register/finish", url.Values{"csrf": {token}, "ceremony": {out["ceremony"].(string)},
		"name": {"thief's key"}, "credential": {string(other.Register(opts))}})
	require.Equal(t, 400, status)
	require.Contains(t, out["error"], "adding another needs one of yours to approve it")
	status, out = b.postJSON("/ui/passkeys/register", url.Values{"csrf": {token}})
	require.Equal(t, 200, status, "%v", out)
	opts, _ = json.Marshal(out["options"])
	var su struct {
		PublicKey struct {
			Challenge string `json:"challenge"`
		} `json:"publicKey"`
	}
	raw, _ := json.Marshal(out["step_up"])
	require.NoError(t, json.Unmarshal(raw, &su))
	challenge, err := base64URL(su.PublicKey.Challenge)
	require.NoError(t, err)
	approval, _ := json.Marshal(key.Sign(challenge))
	status, out = b.postJSON("/ui/passkeys/register/finish", url.Values{"csrf": {token}, "ceremony": {out["ceremony"].(string)},
		"name": {"second key"}, "credential": {string(other.Register(opts))}, "step_up": {string(approval)}})
	require.Equal(t, 200, status, "%v", out)
	require.Contains(t, b.get("/ui/passkeys").body, "second key")

	// The last passkey is not removed from a session.
	ids := regexp.MustCompile(`name="id" value="([^"]+)"`).FindAllStringSubmatch(b.get("/ui/passkeys").body, -1)
	require.Len(t, ids, 2)
	require.Equal(t, http.StatusSeeOther, b.post("/ui/passkeys/remove", url.Values{"csrf": {token}, "id": {ids[0][1]}}).status)
	p = b.post("/ui/passkeys/remove", url.Values{"csrf": {token}, "id": {ids[1][1]}})
	require.Equal(t, http.StatusConflict, p.status)
	require.Contains(t, p.body, "can be removed only by an administrator")
}

func base64URL(s string) ([]byte, error) { return base64.RawURLEncoding.DecodeString(s) }

// TestFirstPasskeyNeedsAFreshSignIn: a person with no passkey yet registers
// one only from a sign-in under FirstPasskeyWithin old, so a session cookie
// stolen later cannot enrol the thief's key.
func TestFirstPasskeyNeedsAFreshSignIn(t *testing.T) {
	t.Parallel()
	env := backendtest.Start(t, backendtest.Options{Policy: passkeyPolicy(t)})
	b := newBrowser(t, env.URL)
	require.Equal(t, http.StatusSeeOther, b.signIn("bob", dev.Password).status)
	token := csrf(t, b.get("/ui/passkeys"))
	_, err := env.Pool.Exec(t.Context(), `UPDATE arap.ui_sessions SET created_at = created_at - interval '11 minutes' WHERE user_name = 'bob'`)
	require.NoError(t, err)
	status, out := b.postJSON("/ui/passkeys/register", url.Values{"csrf": {token}})
	require.Equal(t, http.StatusForbidden, status, "%v", out)
	require.Contains(t, out["error"], "sign out and sign in again")

	b = newBrowser(t, env.URL)
	require.Equal(t, http.StatusSeeOther, b.signIn("bob", dev.Password).status)
	token = csrf(t, b.get("/ui/passkeys"))
	status, out = b.postJSON("/ui/passkeys/register", url.Values{"csrf": {token}})
	require.Equal(t, http.StatusOK, status, "%v", out)
	require.NotEmpty(t, out["options"])
}
