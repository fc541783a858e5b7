package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/internal/npmtest"
)

// axeCore is the accessibility engine the browser tests run, pinned.
const axeCore = "axe-core@4.14.1"

// axeViolation is one rule axe found broken, with where.
type axeViolation struct {
	ID     string `json:"id"`
	Impact string `json:"impact"`
	Help   string `json:"help"`
	Nodes  []struct {
		Target []string `json:"target"`
	} `json:"nodes"`
}

// axeCheck runs axe-core's WCAG 2.1 A and AA rules on the page the browser
// shows (injected from the npm package, so the page's own CSP has no say)
// and fails the test listing what it finds.
func axeCheck(t *testing.T, ctx context.Context, script, name string) {
	t.Helper()
	var found []axeViolation
	do(t, ctx, "axe-core on "+name, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		if _, err := chromedp.Evaluate[any](`typeof axe === "undefined" ? (0, eval)(`+jsString(script)+`) : null`)(ctx, tg); err != nil {
			return err
		}
		v, err := chromedp.Evaluate[[]axeViolation](`axe.run(document, {runOnly: {type: "tag", values: ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]}, resultTypes: ["violations"]})
			.then(r => r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.map(n => ({target: n.target}))})))`,
			chromedp.EvalAwaitPromise)(ctx, tg)
		found = v
		return err
	}))
	var lines []string
	for _, v := range found {
		var at []string
		for _, n := range v.Nodes {
			at = append(at, strings.Join(n.Target, " "))
		}
		lines = append(lines, v.ID+" ("+v.Impact+"): "+v.Help+" at "+strings.Join(at, ", "))
	}
	require.Empty(t, lines, "%s: WCAG 2.1 AA violations found by axe-core", name)
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string {
	r := strings.NewReplacer(`\`, `\\`, "`", "\\`", "${", "\\${")
	return "`" + r.Replace(s) + "`"
}

// controlContrast lists the form controls and framed buttons whose border
// has less than 3:1 against what is behind them (WCAG 1.4.11), computed
// from the colours the browser uses.
const controlContrast = `(() => {
  const rgb = s => (s.match(/[\d.]+/g) || []).map(Number);
  const lum = c => { const [r, g, b] = c.slice(0, 3).map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  const behind = e => { for (let p = e.parentElement; p; p = p.parentElement) { const c = rgb(getComputedStyle(p).backgroundColor);
    if (c.length === 3 || c[3] > 0) return c; } return [255, 255, 255]; };
  const out = [];
  document.querySelectorAll('input:not([type=hidden]), select, textarea, button').forEach(e => {
    const cs = getComputedStyle(e);
    if (parseFloat(cs.borderTopWidth) === 0 || e.offsetParent === null) return;
    const own = rgb(cs.backgroundColor), bg = behind(e);
    if (e.tagName === 'BUTTON' && own.join() !== bg.slice(0, 3).join()) return; // a filled button is its own boundary
    const a = lum(rgb(cs.borderTopColor)), b = lum(bg), ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    if (ratio < 3) out.push(e.outerHTML.slice(0, 80) + ': ' + ratio.toFixed(2) + ':1');
  });
  return out;
})()`

// focusRing reports the focused element and its outline.
type focusRing struct {
	Tag   string `json:"tag"`
	Style string `json:"style"`
	Width string `json:"width"`
	Color string `json:"color"`
}

const activeRing = `(() => { const e = document.activeElement, cs = getComputedStyle(e);
  return {tag: e.tagName + (e.id ? '#' + e.id : ''), style: cs.outlineStyle, width: cs.outlineWidth, color: cs.outlineColor}; })()`

// waitJS waits, within a step's deadline, until expr is true in the page.
func waitJS(t *testing.T, ctx context.Context, what, expr string) {
	t.Helper()
	do(t, ctx, what, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Poll[bool](expr)(ctx, tg)
		return err
	}))
}

func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	require.NoError(t, err, expr)
	return v
}

// TestBrowserAccessibility checks every page of the approver UI in one
// Chromium: axe-core finds no WCAG 2.1 AA violation on the sign-in page,
// a failed sign-in, the queue (empty and not), a pending request, a refused
// decision, a decided request, a missing request, and the history at
// desktop and phone width; control borders have 3:1; the keyboard focus
// shows our own ring; an error takes the focus; the 3-second refresh keeps
// the focus on the link it was on and announces new requests and status
// changes in a polite live region; and at 375 px the history's scroll
// region is reached and scrolled by keyboard.
func TestBrowserAccessibility(t *testing.T) {
	t.Parallel()
	axePath := filepath.Join(npmtest.Package(t, axeCore), "node_modules", "axe-core", "axe.min.js")
	raw, err := os.ReadFile(axePath)
	require.NoError(t, err)
	axe := string(raw)
	ctx := newBrowser(t)
	d := startDev(t, dbtest.URL(t))
	base := d.p.url()
	check := func(name string) {
		t.Helper()
		axeCheck(t, ctx, axe, name)
		require.Empty(t, eval[[]string](t, ctx, controlContrast), "%s: control borders under 3:1", name)
		checkPage(t, ctx, name)
	}

	// Sign-in, and a failed one: the error takes the focus.
	do(t, ctx, "open the sign-in page", chromedp.Navigate(base+"/ui/login"), chromedp.WaitVisible(chromedp.ID("username")))
	check("sign-in")
	do(t, ctx, "move the focus by keyboard", chromedp.KeyEvent(kb.Tab))
	ring := eval[focusRing](t, ctx, activeRing)
	require.Equal(t, focusRing{Tag: "INPUT#password", Style: "solid", Width: "3px", Color: "rgb(11, 92, 173)"}, ring, "our own focus style")
	do(t, ctx, "sign in with a wrong password",
		chromedp.SendKeys(chromedp.ID("username"), "bob"),
		chromedp.SendKeys(chromedp.ID("password"), "wrong"),
		chromedp.Click(chromedp.CSS(`button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.ID("error")))
	waitJS(t, ctx, "the error takes the focus", `document.activeElement && document.activeElement.id === "error"`)
	check("failed sign-in")

	signIn(t, ctx, base, "bob")
	check("empty queue")

	// The queue: with the focus on a request's link, refreshes keep it
	// there, and a new request is announced.
	first := request(t, d.api, d.api, dev.PEPToken, toolCall("wire_transfer", map[string]any{"to": "acct-991", "amount": 50000}))
	link := `a[href="/ui/requests/` + first + `"]`
	do(t, ctx, "see the request arrive", chromedp.WaitVisible(chromedp.CSS(link)))
	require.Equal(t, "New request: wire_transfer for user alice, amount 50,000, to acct-991.", eval[string](t, ctx, `document.getElementById("live").textContent`))
	require.Contains(t, eval[string](t, ctx, `document.querySelector('`+link+`').innerText`), "amount 50,000 · to acct-991", "key arguments")
	check("queue")
	do(t, ctx, "focus the request's link", chromedp.Focus(chromedp.CSS(link)))
	second := request(t, d.api, d.api, dev.PEPToken, toolCall("wire_transfer", map[string]any{"to": "acct-7", "amount": 30000}))
	waitJS(t, ctx, "a refresh brings the second request", `!!document.querySelector('a[href="/ui/requests/`+second+`"]')`)
	require.Equal(t, "/ui/requests/"+first, eval[string](t, ctx, `document.activeElement.getAttribute("href") || document.activeElement.tagName`),
		"the focus stays on the link it was on")
	require.True(t, eval[bool](t, ctx, `document.activeElement === document.querySelector('`+link+`')`))
	require.Equal(t, "New request: wire_transfer for user alice, amount 30,000, to acct-7.", eval[string](t, ctx, `document.getElementById("live").textContent`),
		"the new request is announced")

	// A pending request; a status change while the focus is on a link is
	// announced, and the focus stays.
	do(t, ctx, "open the second request", chromedp.Navigate(base+"/ui/requests/"+second), chromedp.WaitVisible(chromedp.ID("approving")))
	require.Contains(t, pageText(t, ctx), "runs once, right away")
	check("pending request")
	do(t, ctx, "open the audit fields and focus the back link",
		chromedp.Click(chromedp.CSS(`ol.audit details summary`)), chromedp.Focus(chromedp.CSS(`p.back a`)))
	status, body := postJSON(t, d.api+"/v1/requests/"+second+"/decisions", dev.ITSMToken, map[string]any{"decision": "approve", "reason": "CHG0042"})
	require.Equal(t, 200, status, "%v", body)
	waitJS(t, ctx, "the status changes in place", `document.getElementById("status").textContent === "Approved"`)
	require.Equal(t, "Status: Approved.", eval[string](t, ctx, `document.getElementById("live").textContent`))
	require.True(t, eval[bool](t, ctx, `document.activeElement === document.querySelector('p.back a')`), "the focus stays on the back link")
	require.True(t, eval[bool](t, ctx, `document.querySelector('ol.audit details').open`), "opened details stay open")
	check("decided request")

	// A refused decision (a reason over the backend's limit) and a missing
	// request: the error takes the focus.
	do(t, ctx, "post a decision the backend refuses", chromedp.Navigate(base+"/ui/requests/"+first), chromedp.WaitVisible(chromedp.ID("deny")),
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Evaluate[any](`document.getElementById("reason").value = "x".repeat(2001); document.getElementById("deny").click()`)(ctx, tg)
			return err
		}),
		chromedp.WaitVisible(chromedp.ID("error")))
	require.Contains(t, eval[string](t, ctx, `document.getElementById("error").textContent`), "Your decision was not recorded")
	waitJS(t, ctx, "the error takes the focus", `document.activeElement && document.activeElement.id === "error"`)
	check("refused decision")
	do(t, ctx, "open a missing request", chromedp.Navigate(base+"/ui/requests/arq_00000000000000000000000000"), chromedp.WaitVisible(chromedp.ID("error")))
	waitJS(t, ctx, "the error takes the focus", `document.activeElement && document.activeElement.id === "error"`)
	check("missing request")

	// The history, at desktop and phone width: the table scrolls in its
	// own region, which the keyboard reaches and scrolls.
	do(t, ctx, "open the history", chromedp.Navigate(base+"/ui/history"), chromedp.WaitVisible(chromedp.CSS("table.history")))
	require.Contains(t, pageText(t, ctx), "Approved")
	check("history")
	do(t, ctx, "emulate a phone", chromedp.EmulateViewport(375, 800))
	check("history at 375 px")
	require.False(t, eval[bool](t, ctx, `document.documentElement.scrollWidth > window.innerWidth`), "the page itself does not scroll sideways")
	region := eval[map[string]any](t, ctx, `(() => { const w = document.getElementById("history-wrap");
		return {overflows: w.scrollWidth > w.clientWidth, tabIndex: w.tabIndex, role: w.getAttribute("role"),
		  name: document.getElementById(w.getAttribute("aria-labelledby")).textContent}; })()`)
	require.Equal(t, map[string]any{"overflows": true, "tabIndex": 0.0, "role": "region", "name": "Requests that have ended"}, region)
	do(t, ctx, "reach the history's region by keyboard", chromedp.Navigate(base+"/ui/history"), chromedp.WaitVisible(chromedp.ID("history-wrap")))
	for range 12 {
		if eval[string](t, ctx, `document.activeElement.id`) == "history-wrap" {
			break
		}
		do(t, ctx, "tab", chromedp.KeyEvent(kb.Tab))
	}
	require.Equal(t, "history-wrap", eval[string](t, ctx, `document.activeElement.id`), "Tab reaches the history's scroll region")
	ring = eval[focusRing](t, ctx, activeRing)
	require.Equal(t, "solid", ring.Style, "the region shows the focus")
	do(t, ctx, "scroll it with the arrow key", chromedp.KeyEvent(kb.ArrowRight), chromedp.KeyEvent(kb.ArrowRight))
	waitJS(t, ctx, "the region scrolls", `document.getElementById("history-wrap").scrollLeft > 0`)
	do(t, ctx, "back to desktop width", chromedp.EmulateViewport(1200, 1000))
}
