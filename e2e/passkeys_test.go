package e2e

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/webauthn"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/passkeys/passkeytest"
)

// virtualAuthenticator gives the browser tab a platform authenticator
// (Chromium's DevTools WebAuthn domain) that verifies the user and
// simulates their presence, as a device's screen lock would.
func virtualAuthenticator(t *testing.T, ctx context.Context) {
	t.Helper()
	_, err := chromedp.Call(ctx, webauthn.Enable, webauthn.EnableParams{})
	require.NoError(t, err)
	_, err = chromedp.Call(ctx, webauthn.AddVirtualAuthenticator, webauthn.AddVirtualAuthenticatorParams{Options: &webauthn.VirtualAuthenticatorOptions{
		Protocol: webauthn.AuthenticatorProtocolCtap2, Ctap2version: webauthn.Ctap2versionCtap21, Transport: webauthn.AuthenticatorTransportInternal,
		HasResidentKey: true, HasUserVerification: true, IsUserVerified: true, AutomaticPresenceSimulation: true,
	}})
	require.NoError(t, err)
}

// TestBrowserPasskeyApproval is a signed decision end to end, in Chromium
// with a virtual authenticator, against `arapd dev` whose wire_transfer rule
// requires one (the UI at http://localhost:<port>, relying party id
// localhost): bob registers a passkey and approves alice's 50,000 transfer
// with it; the decision API is refused on that rule; carol, without a
// passkey, is told to register one and offered no buttons; a decision
// posted without a signature (a stolen session) is refused; `arapctl audit
// verify` checks the signature, and after the stored assertion is changed
// and the chain re-hashed, reports that vote while the chain verifies.
func TestBrowserPasskeyApproval(t *testing.T) {
	t.Parallel()
	bobTab := newBrowser(t)
	dbURL := dbtest.URL(t)
	dataDir := filepath.Join(t.TempDir(), "dev")
	require.NoError(t, os.MkdirAll(dataDir, 0o700))
	policy := strings.Replace(string(dev.SeedPolicy()), "      kinds: [itsm]        # or an ITSM system through the decision API\n",
		"      kinds: [itsm]        # or an ITSM system through the decision API\n      require_passkey: true\n", 1)
	require.Contains(t, policy, "require_passkey: true")
	require.NoError(t, os.WriteFile(filepath.Join(dataDir, "policy.yaml"), []byte(policy), 0o600))
	d := startDevAt(t, dbURL, dataDir)
	u, err := url.Parse(d.p.url())
	require.NoError(t, err)
	base := "http://localhost:" + u.Port() // a secure context, and a name a relying party id can be
	db, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(db.Close)

	// bob registers a passkey.
	virtualAuthenticator(t, bobTab)
	signIn(t, bobTab, base, "bob")
	do(t, bobTab, "register a passkey",
		chromedp.Navigate(base+"/ui/passkeys"),
		chromedp.WaitVisible(chromedp.ID("register-passkey")),
		chromedp.SendKeys(chromedp.ID("passkey-name"), "virtual key"),
		chromedp.Click(chromedp.ID("register-passkey")),
		chromedp.WaitVisible(`//p[@class="flash" and contains(., "Your passkey was registered")]`),
	)
	require.Contains(t, pageText(t, bobTab), "virtual key")
	checkPage(t, bobTab, "passkeys")
	screenshot(t, bobTab, "passkeys.png")

	// alice's agent asks for a transfer the rule gates with a signature.
	alice := append([]string{"ARAP_MCP_TOKEN=dev-agent-token"}, d.env...)
	code, out := startArapctl(t, alice, "mcp", "call", "wire_transfer", "--arg", "to=acct-991", "--arg", "amount=50000", "--no-wait").exit(t)
	require.Equal(t, 0, code, out)
	var id string
	require.Eventually(t, func() bool {
		return db.QueryRow(context.Background(), `SELECT id FROM arap.requests WHERE status = 'pending'`).Scan(&id) == nil
	}, 30*time.Second, 50*time.Millisecond)

	// The decision API cannot carry a signature: refused, with the reason.
	status, body := postJSON(t, d.api+"/v1/requests/"+id+"/decisions", dev.ITSMToken, map[string]any{"decision": "approve", "reason": "CHG0042"})
	require.Equal(t, 403, status, "%v", body)
	require.Equal(t, "urn:omcp:arap:error:signature_required", body["type"])
	require.Contains(t, body["detail"], "rule wire_transfer_large requires a decision signed with the approver's passkey in the web UI")

	// carol has no passkey: she is told so, and offered no buttons.
	carolTab := newBrowser(t)
	signIn(t, carolTab, base, "carol")
	do(t, carolTab, "open the request as carol", chromedp.Navigate(base+"/ui/requests/"+id), chromedp.WaitVisible(chromedp.ID("passkey-needed")))
	require.Contains(t, pageText(t, carolTab), "requires a decision signed with your passkey, and you have none registered")
	buttons, err := chromedp.Run(carolTab, chromedp.Evaluate[int](`document.querySelectorAll('#approve, #deny').length`))
	require.NoError(t, err)
	require.Zero(t, buttons)
	// Posted anyway, as a script with her session would: refused.
	refusedInBrowser(t, carolTab, id, "requires a decision signed with your passkey, and this one is not signed")

	// bob's session without his authenticator (a stolen cookie): the form
	// posted without a signature is refused.
	do(t, bobTab, "open the request as bob", chromedp.Navigate(base+"/ui/requests/"+id), chromedp.WaitVisible(chromedp.ID("passkey-note")))
	refusedInBrowser(t, bobTab, id, "requires a decision signed with your passkey, and this one is not signed")

	// bob approves, signing with his passkey.
	do(t, bobTab, "open the request to sign", chromedp.Navigate(base+"/ui/requests/"+id), chromedp.WaitVisible(chromedp.ID("approve")))
	screenshot(t, bobTab, "request-passkey.png")
	checkPage(t, bobTab, "request-passkey")
	do(t, bobTab, "approve with the passkey",
		chromedp.SendKeys(chromedp.ID("reason"), "Invoice 7731"),
		chromedp.Click(chromedp.ID("approve")),
		chromedp.WaitVisible(`//p[@class="flash" and contains(., "Your approval was recorded")]`),
	)
	var st string
	require.NoError(t, db.QueryRow(context.Background(), `SELECT status FROM arap.requests WHERE id = $1`, id).Scan(&st))
	require.Equal(t, "approved", st)
	var signed bool
	require.NoError(t, db.QueryRow(context.Background(), `SELECT data ? 'assertion' FROM arap.audit_events WHERE chain = $1 AND kind = 'vote.approve'`, id).Scan(&signed))
	require.True(t, signed, "the vote's audit event carries the assertion")

	env := []string{"DATABASE_URL=" + dbURL}
	code, out = startArapctl(t, env, "audit", "verify").exit(t)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "signed decisions: 1, all verify")

	// Someone who can write the database changes the stored signature and
	// re-hashes the chain: the chain verifies, the signature does not.
	_, err = db.Exec(context.Background(), `UPDATE arap.audit_events SET data = jsonb_set(data, '{assertion,signature}',
		to_jsonb(overlay(data#>>'{assertion,signature}' placing CASE WHEN substr(data#>>'{assertion,signature}', 20, 1) = 'A' THEN 'B' ELSE 'A' END from 20 for 1)))
		WHERE chain = $1 AND kind = 'vote.approve'`, id)
	require.NoError(t, err)
	require.NoError(t, passkeytest.Rehash(context.Background(), db, id))
	code, out = startArapctl(t, env, "audit", "verify").exit(t)
	require.NotEqual(t, 0, code, out)
	require.Contains(t, out, "all intact", "the re-hashed chain verifies")
	require.Contains(t, out, "SIGNATURE: request "+id+" vote by user:bob")
	require.Contains(t, out, "signature does not verify")
}

// refusedInBrowser posts the open request's decision form as a page
// without the passkey script would, and waits for the refusal.
func refusedInBrowser(t *testing.T, ctx context.Context, id, want string) {
	t.Helper()
	do(t, ctx, "post an unsigned approval",
		chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			_, err := chromedp.Evaluate[any](`(function () {
				var f = document.createElement('form');
				f.method = 'post'; f.action = '/ui/requests/`+id+`/decide';
				var csrf = document.querySelector('input[name="csrf"]').value;
				[['csrf', csrf], ['decision', 'approve']].forEach(function (kv) {
					var i = document.createElement('input'); i.type = 'hidden'; i.name = kv[0]; i.value = kv[1]; f.appendChild(i);
				});
				document.body.appendChild(f); f.submit();
			})()`)(ctx, t)
			return err
		}),
		chromedp.WaitVisible(`//p[@id="error" and contains(., "not recorded")]`),
	)
	require.Contains(t, pageText(t, ctx), want)
}
