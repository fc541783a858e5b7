package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/contract"
	"github.com/omcp/arap/internal/dbtest"
)

// artifactsDir receives the screenshots the browser tests take:
// $ARAP_ARTIFACT_DIR, or .artifacts at the top of the repository.
func artifactsDir() string {
	if d := os.Getenv("ARAP_ARTIFACT_DIR"); d != "" {
		return d
	}
	return filepath.Join("..", ".artifacts")
}

// chromium finds the browser, or skips the test when the machine has none
// (CI installs Debian's chromium and sets ARAP_REQUIRE_BROWSER, so there a
// missing browser fails instead).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := osexec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("ARAP_REQUIRE_BROWSER") != "" {
		t.Fatal("no Chromium on PATH (apt-get install chromium)")
	}
	t.Skip("no Chromium on PATH; install Debian's chromium package to run the browser tests")
	return ""
}

// newBrowser starts headless Chromium for the test and returns a context
// that drives one tab. Each step gets its own deadline (see do).
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1200, 1000),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	tab, cancelTab := chromedp.NewContext(alloc)
	// The first action starts the browser, which lives as long as the
	// context of that action: it must not carry the deadline.
	require.NoError(t, chromedp.Do(tab), "start Chromium")
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	return tab
}

// stepTimeout bounds one browser step: generous for a loaded machine, and a
// failure says which step and where the browser was.
const stepTimeout = 90 * time.Second

// do runs browser actions as one step; on failure it saves a screenshot
// and reports the page the browser was on.
func do(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	step, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	if err := chromedp.Do(step, actions...); err != nil {
		diag, dcancel := context.WithTimeout(ctx, 10*time.Second)
		defer dcancel()
		where, _ := chromedp.Run(diag, chromedp.Location())
		text, _ := chromedp.Run(diag, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		if png, err := chromedp.Run(diag, chromedp.FullScreenshot(100)); err == nil {
			_ = os.MkdirAll(artifactsDir(), 0o755)
			_ = os.WriteFile(filepath.Join(artifactsDir(), "failed-"+strings.ReplaceAll(t.Name(), "/", "_")+".png"), png, 0o644)
		}
		t.Fatalf("browser step %q failed: %v\nat %s:\n%s", what, err, where, text)
	}
}

// signIn signs in through the login page as user.
func signIn(t *testing.T, ctx context.Context, base, user string) {
	t.Helper()
	do(t, ctx, "sign in as "+user,
		chromedp.Navigate(base+"/ui/login"),
		chromedp.WaitVisible(chromedp.ID("username")),
		chromedp.SendKeys(chromedp.ID("username"), user),
		chromedp.SendKeys(chromedp.ID("password"), "dev-password"),
		chromedp.Click(chromedp.CSS(`button[type="submit"]`)),
		// Signed in, the header names the person; until the next page has
		// loaded, the login page is still there, so wait for that.
		chromedp.WaitVisible(chromedp.CSS("form.who")),
	)
	require.Equal(t, "Pending requests", textOf(t, ctx, "h1"), "signed in as %s", user)
}

func signOut(t *testing.T, ctx context.Context) {
	t.Helper()
	do(t, ctx, "sign out",
		chromedp.Click(chromedp.CSS(`form.who button`)),
		chromedp.WaitVisible(chromedp.ID("username")),
	)
}

// decideInBrowser opens the queue, waits (without reloading: the page
// refreshes itself) for the request of tool with the given text to appear,
// opens it and decides it with a reason.
func decideInBrowser(t *testing.T, ctx context.Context, base, tool, contains, decision, reason string) {
	t.Helper()
	item := `//li[contains(@class,"item")][.//span[@class="tool" and .="` + tool + `"]]`
	do(t, ctx, "open the "+tool+" request",
		chromedp.Navigate(base+"/ui/"),
		chromedp.WaitVisible(item),
		chromedp.Click(item+`//a`),
		chromedp.WaitVisible(chromedp.ID("decide-h")),
	)
	require.Contains(t, pageText(t, ctx), contains, "the request page shows what is asked")
	do(t, ctx, decision+" the "+tool+" request",
		chromedp.SendKeys(chromedp.ID("reason"), reason),
		chromedp.Click(chromedp.ID(decision)),
		chromedp.WaitVisible(chromedp.CSS(".flash")),
	)
}

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png := saveArtifactPNG(t, ctx, name)
	if os.Getenv("ARAP_UPDATE_DOCS") != "" && name == "request.png" {
		require.NoError(t, os.WriteFile(filepath.Join("..", "docs", "img", "request.png"), png, 0o644))
	}
}

// saveArtifact saves a full-page screenshot in the artifacts directory and
// returns its path.
func saveArtifact(t *testing.T, ctx context.Context, name string) string {
	t.Helper()
	saveArtifactPNG(t, ctx, name)
	p, err := filepath.Abs(filepath.Join(artifactsDir(), name))
	require.NoError(t, err)
	return p
}

func saveArtifactPNG(t *testing.T, ctx context.Context, name string) []byte {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(artifactsDir(), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(artifactsDir(), name), png, 0o644))
	return png
}

// checkPage asserts what every page must hold: each form control has a
// label (or an aria-label), and nothing is loaded from another origin (no
// external fonts, scripts or CDNs).
func checkPage(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	unlabelled, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('input:not([type=hidden]), select, textarea'))
		.filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label')).map(e => e.outerHTML)`))
	require.NoError(t, err)
	require.Empty(t, unlabelled, "%s: form controls without a label", name)
	foreign, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`performance.getEntriesByType('resource').map(e => e.name)
		.concat(Array.from(document.querySelectorAll('[src], link[href]')).map(e => e.src || e.href))
		.filter(u => new URL(u, location.href).origin !== location.origin)`))
	require.NoError(t, err)
	require.Empty(t, foreign, "%s: resources from another origin", name)
}

func pageText(t *testing.T, ctx context.Context) string {
	t.Helper()
	return textOf(t, ctx, "main")
}

// textOf returns the visible text of the first element css matches, read in
// one evaluation in the page: the pages refresh their main section by
// replacing its nodes, and a query followed by a read can fall on either
// side of a refresh (-32000, no node with given id found; seen on a loaded
// machine).
func textOf(t *testing.T, ctx context.Context, css string) string {
	t.Helper()
	do(t, ctx, "find "+css, chromedp.WaitVisible(chromedp.CSS(css)))
	sel, err := json.Marshal(css)
	require.NoError(t, err)
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(e => e ? e.innerText : "")(document.querySelector(`+string(sel)+`))`))
	require.NoError(t, err)
	return s
}

// devStack is `arapd dev` on a test database, with its MCP address.
type devStack struct {
	p      *proc
	api    string // the backend API through a contract proxy (the web UI is at p.url())
	mcpURL string
	env    []string // for arapctl mcp
}

func startDev(t *testing.T, dbURL string) *devStack {
	t.Helper()
	return startDevAt(t, dbURL, filepath.Join(t.TempDir(), "dev"))
}

// startDevAt is startDev with its data dir at dataDir.
func startDevAt(t *testing.T, dbURL, dataDir string) *devStack {
	t.Helper()
	p := startArapd(t, []string{"DATABASE_URL=" + dbURL}, "dev", "--addr", "127.0.0.1:0", "--mcp-addr", "127.0.0.1:0",
		"--data-dir", dataDir)
	m := p.waitLog("mcp front-end started", 60*time.Second)
	addr, _ := m["addr"].(string)
	mcpURL := "http://" + addr + "/mcp"
	return &devStack{p: p, api: contract.Proxy(t, p.url(), nil), mcpURL: mcpURL, env: []string{
		"ARAP_MCP_URL=" + mcpURL, "ARAP_MCP_STATE=" + filepath.Join(t.TempDir(), "tasks.json"),
	}}
}

// background runs arapctl with env and collects its output.
type background struct {
	cmd  *osexec.Cmd
	out  *lockedBuffer
	done chan struct{}
}

func startArapctl(t *testing.T, env []string, args ...string) *background {
	t.Helper()
	require.NoError(t, buildErr)
	cmd := osexec.Command(filepath.Join(binDir, "arapctl"), args...)
	cmd.Env = append(os.Environ(), env...)
	return startBackground(t, cmd)
}

// startBackground starts cmd in a process group of its own, collecting its
// output; the end of the test kills the whole group (a shell's children
// too), and Wait does not hang on pipes a child still holds.
func startBackground(t *testing.T, cmd *osexec.Cmd) *background {
	t.Helper()
	b := &background{cmd: cmd, out: &lockedBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = b.out, b.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	require.NoError(t, cmd.Start())
	go func() { _ = cmd.Wait(); close(b.done) }()
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); <-b.done })
	return b
}

// waitOutput waits until the output contains s.
func (b *background) waitOutput(t *testing.T, s string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(b.out.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("arapctl output has no %q within 60s:\n%s", s, b.out.String())
		}
		select {
		case <-b.done:
			if !strings.Contains(b.out.String(), s) {
				t.Fatalf("arapctl exited without printing %q:\n%s", s, b.out.String())
			}
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// exit waits for the command to end and returns its exit code and output.
func (b *background) exit(t *testing.T) (int, string) {
	t.Helper()
	select {
	case <-b.done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("arapctl did not finish within 2 minutes:\n%s", b.out.String())
	}
	return b.cmd.ProcessState.ExitCode(), b.out.String()
}

// TestBrowserApproval is the human path end to end through a real browser:
// alice's agent calls wire_transfer for 50,000 and waits; bob signs in,
// finds the request in his queue as it arrives, reads it and approves it;
// `arapctl mcp wait` prints the completed result. It also checks that bob
// cannot decide a request made for him (he sees why, with no buttons), and
// that a decision posted without the CSRF token is refused.
func TestBrowserApproval(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	dbURL := dbtest.URL(t)
	d := startDev(t, dbURL)
	base := d.p.url()

	do(t, ctx, "open the sign-in page", chromedp.Navigate(base+"/ui/login"), chromedp.WaitVisible(chromedp.ID("username")))
	checkPage(t, ctx, "sign-in")
	signIn(t, ctx, base, "bob")
	screenshot(t, ctx, "queue-empty.png")

	alice := append([]string{"ARAP_MCP_TOKEN=dev-agent-token"}, d.env...)
	call := startArapctl(t, alice, "mcp", "call", "wire_transfer", "--arg", "to=acct-991", "--arg", "amount=50000", "--no-wait")
	code, out := call.exit(t)
	require.Equal(t, 0, code, out)
	taskID := strings.Fields(out)[1]
	require.True(t, strings.HasPrefix(taskID, "tsk_"), out)

	// The queue shows it without a reload (the page refreshes itself).
	item := `//li[contains(@class,"item")][.//span[@class="tool" and .="wire_transfer"]]`
	do(t, ctx, "see the request arrive in the queue", chromedp.WaitVisible(item))
	screenshot(t, ctx, "queue.png")
	checkPage(t, ctx, "queue")
	do(t, ctx, "open the request", chromedp.Click(item+`//a`), chromedp.WaitVisible(chromedp.ID("approve")))
	text := pageText(t, ctx)
	for _, want := range []string{"user alice", "agent:demo", "wire_transfer", "50,000", "acct-991", "Treasury approval",
		"Transfers over $25,000 require approval by a member of treasury", "wire_transfer_large", "0 of 1 approvals", "request.submitted"} {
		require.Contains(t, text, want)
	}
	require.NotContains(t, text, "agent:demo → agent:demo", "the agent is in the subject's act claim and the client's actor: shown once")
	screenshot(t, ctx, "request.png")
	checkPage(t, ctx, "request")

	// A form posted without its CSRF token is refused, and nothing changes.
	// (Removed and submitted in one script, so no refresh comes between.)
	do(t, ctx, "post the decision without its CSRF token",
		chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			_, err := chromedp.Evaluate[any](`document.querySelector('#decide-form input[name="csrf"]').remove(); document.getElementById('approve').click()`)(ctx, t)
			return err
		}),
		chromedp.WaitVisible(`//pre[contains(., "CSRF")]`),
	)
	require.Contains(t, textOf(t, ctx, "body"), "missing or wrong CSRF token")

	// `arapctl mcp wait` resumes the task from its state file and waits.
	wait := startArapctl(t, alice, "mcp", "wait")
	wait.waitOutput(t, "working")
	decideInBrowser(t, ctx, base, "wire_transfer", "acct-991", "approve", "Invoice 7731, checked with the vendor")
	code, out = wait.exit(t)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "task "+taskID+" completed")
	require.Contains(t, out, "Transfer of $50,000 to acct-991 completed")
	require.Contains(t, out, `"io.modelcontextprotocol/tool-approval-disposition": "approved-executed"`)

	// The request page now shows the decision, the approval and no buttons.
	do(t, ctx, "open the history", chromedp.Navigate(base+"/ui/history"), chromedp.WaitVisible(chromedp.CSS("table.history")))
	require.Contains(t, pageText(t, ctx), "user:bob: approve")

	// bob's own request (through his agent): he sees why he cannot decide it.
	bobAgent := append([]string{"ARAP_MCP_TOKEN=dev-bob-agent-token"}, d.env...)
	code, out = startArapctl(t, bobAgent, "mcp", "call", "wire_transfer", "--arg", "to=acct-123", "--arg", "amount=40000", "--no-wait").exit(t)
	require.Equal(t, 0, code, out)
	do(t, ctx, "list everything naming bob", chromedp.Navigate(base+"/ui/?show=all"))
	own := `//li[contains(@class,"item")][.//span[@class="why-not"]]`
	do(t, ctx, "open bob's own request", chromedp.WaitVisible(own), chromedp.Click(own+`//a`),
		chromedp.WaitVisible(chromedp.ID("why-not")))
	text = pageText(t, ctx)
	require.Contains(t, text, "acct-123")
	require.Contains(t, text, "You cannot decide this request: user:bob cannot decide a request made on their behalf or through them")
	buttons, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#approve, #deny, #decide-form').length`))
	require.NoError(t, err)
	require.Zero(t, buttons, "no decision buttons for an ineligible approver")
	screenshot(t, ctx, "request-ineligible.png")

	// The request page is live too: when an ITSM system approves it, the
	// open page shows the new status without a reload.
	approveOnlyPending(t, d.api)
	do(t, ctx, "see the status change in place", chromedp.WaitVisible(`//span[@id="status" and text()="Approved"]`))
	require.Contains(t, pageText(t, ctx), "client:dev-itsm")

	// A phone-sized screen still shows the whole request without sideways scrolling.
	do(t, ctx, "emulate a phone", chromedp.EmulateViewport(375, 800))
	overflow, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.documentElement.scrollWidth > window.innerWidth`))
	require.NoError(t, err)
	screenshot(t, ctx, "request-phone.png")
	if overflow {
		wide, _ := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('body *')).filter(e => e.getBoundingClientRect().right > window.innerWidth).map(e => e.tagName + '.' + e.className)`))
		t.Errorf("the request page is wider than a phone-sized screen; too wide: %v", wide)
	}
	signOut(t, ctx)
}

// lockedBuffer is an output buffer safe to read while a process writes it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
