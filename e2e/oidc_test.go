package e2e

import (
	"net"
	"os"
	osexec "os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/internal/oidctest"
)

// TestBrowserOIDCSignIn: `arapd serve` with local passwords off and an
// OpenID provider (a real one, the zitadel op package, in this test process
// on loopback, on another site). Chromium signs in through the login page's button and the
// provider's login form, comes back signed in as the user the provider's
// verified claims made, and sees the queue: the treasury request is there
// because the provider's groups claim made her a treasury member.
func TestBrowserOIDCSignIn(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	// The provider on another site (localhost) than arap (127.0.0.1), as in
	// production: its redirects back are cross-site navigations.
	op := oidctest.StartOn(t, "localhost")
	op.Put(oidctest.User{ID: "idp-42", Username: "tess", Password: "op-password", GivenName: "Tess", FamilyName: "Ury",
		Email: "tess@corp.example", EmailVerified: true, Groups: []string{"treasury"}})

	dbURL := dbtest.URL(t)
	env := []string{"DATABASE_URL=" + dbURL, "ARAP_MASTER_KEY=" + masterKey, "ARAP_OIDC_CLIENT_SECRET=" + oidctest.ClientSecret}
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	require.NoError(t, os.WriteFile(policy, dev.SeedPolicy(), 0o600))
	arapctl(t, env, "groups", "create", "treasury")
	pep := token(arapctl(t, env, "clients", "create", "--name", "pep", "--scope", "evaluate,request", "--actor", "agent:*"))
	p := startArapd(t, env, "serve", "--addr", "127.0.0.1:0", "--policy", policy, "--local-passwords=false",
		"--oidc-issuer", op.Issuer, "--oidc-client-id", oidctest.ClientID, "--oidc-groups-claim", oidctest.GroupsClaim, "--oidc-name", "Test IdP")
	base := p.url()
	op.AllowRedirect(base + "/ui/oidc/callback")
	request(t, base, base, pep, toolCall("wire_transfer", map[string]any{"to": "acct-991", "amount": 50000}))

	do(t, ctx, "open the sign-in page", chromedp.Navigate(base+"/ui/login"), chromedp.WaitVisible(chromedp.ID("sso")))
	text := pageText(t, ctx)
	require.Contains(t, text, "Sign in with Test IdP")
	require.NotContains(t, text, "Password", "local passwords are off")
	do(t, ctx, "sign in at the provider",
		chromedp.Click(chromedp.ID("sso")),
		chromedp.WaitVisible(chromedp.ID("op-username")),
		chromedp.SendKeys(chromedp.ID("op-username"), "tess"),
		chromedp.SendKeys(chromedp.ID("op-password"), "op-password"),
		chromedp.Click(chromedp.ID("op-submit")),
		// Back at arap, signed in: the header names the person.
		chromedp.WaitVisible(chromedp.CSS("form.who")),
	)
	require.Equal(t, "Pending requests", textOf(t, ctx, "h1"))
	item := `//li[contains(@class,"item")][.//span[@class="tool" and .="wire_transfer"]]`
	do(t, ctx, "see the treasury request in the queue", chromedp.WaitVisible(item))
	require.Contains(t, textOf(t, ctx, "form.who"), "Tess Ury")
	screenshot(t, ctx, "oidc-queue.png")
}

// TestServeRefusesMisconfiguredOIDC: an issuer that does not answer stops
// `arapd serve` at start, with a message naming the issuer and the step.
func TestServeRefusesMisconfiguredOIDC(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	issuer := "http://" + l.Addr().String()
	require.NoError(t, l.Close())
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	require.NoError(t, os.WriteFile(policy, dev.SeedPolicy(), 0o600))
	cmd := osexec.Command(filepath.Join(binDir, "arapd"), "serve", "--addr", "127.0.0.1:0", "--policy", policy,
		"--oidc-issuer", issuer, "--oidc-client-id", "arap")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbtest.URL(t), "ARAP_MASTER_KEY="+masterKey, "ARAP_OIDC_CLIENT_SECRET=s")
	out, err := cmd.CombinedOutput()
	var exit *osexec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out)
	require.Equal(t, 1, exit.ExitCode())
	require.Regexp(t, regexp.MustCompile(`arapd: backend: sso: issuer `+regexp.QuoteMeta(issuer)+`: discovery \(.*\): .*connection refused`), string(out))
}
