package webui_test

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

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

	sign := func(decision string) (string, string) {
		status, out := b.postJSON("/ui/requests/"+id+"/challenge", url.Values{"csrf": {token}, "decision": {decision}})
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
	ceremony, a := sign("deny")
	p = b.post("/ui/requests/"+id+"/decide", url.Values{"csrf": {token}, "decision": {"approve"}, "ceremony": {ceremony}, "assertion": {a}})
	require.Equal(t, 400, p.status)
	require.Contains(t, p.body, "the signature was made for another decision")

	ceremony, a = sign("approve")
	form := url.Values{"csrf": {token}, "decision": {"approve"}, "ceremony": {ceremony}, "assertion": {a}, "reason": {"ok"}}
	p = b.post("/ui/requests/"+id+"/decide", form)
	require.Equal(t, http.StatusSeeOther, p.status, p.body)
	require.Equal(t, "/ui/?done=approve", p.location)
	p = b.post("/ui/requests/"+id+"/decide", form)
	require.Equal(t, 400, p.status, "a ceremony is used once")
	require.Contains(t, p.body, "expired or was already used")
}

func base64URL(s string) ([]byte, error) { return base64.RawURLEncoding.DecodeString(s) }
