package webui_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dev"
)

// section is the part of body from the element with attribute attr up to
// the end of the element named end.
func section(t *testing.T, body, attr, end string) string {
	t.Helper()
	i := strings.Index(body, attr)
	require.GreaterOrEqual(t, i, 0, "no %s in the page:\n%s", attr, body)
	s := body[i:]
	j := strings.Index(s, end)
	require.GreaterOrEqual(t, j, 0)
	return s[:j]
}

// TestRequestPageSaysWhatApprovingDoes: before anyone approves, the page
// says the call runs once, right away, and until when the approval will be
// valid, with the rule's figure (1 hour for wire_transfer_large); the
// approval issued then lasts exactly that long. Where one approval is not
// enough, it says how many are still needed.
func TestRequestPageSaysWhatApprovingDoes(t *testing.T) {
	clock := newClock()
	env := backendtest.Start(t, backendtest.Options{Now: clock.Now})
	id := env.Submit(t, wireCall("alice", 50000))
	repo := env.Submit(t, map[string]any{
		"subject":  map[string]any{"type": "user", "id": "alice"},
		"action":   map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": "delete_repository", "properties": map[string]any{"arguments": map[string]any{"repository": "acme/legacy"}}},
	})

	bob := newBrowser(t, env.URL)
	require.Equal(t, http.StatusSeeOther, bob.signIn("bob", dev.Password).status)
	p := bob.get("/ui/requests/" + id)
	require.Equal(t, 200, p.status)
	say := strings.Join(strings.Fields(section(t, p.body, `id="approving"`, "</div>")), " ")
	until := clock.Now().Truncate(time.Second).Add(time.Hour).UTC()
	require.Contains(t, say, "yours is the last approval needed, so the request is approved and the call above, exactly as shown, runs once, right away.")
	require.Contains(t, say, `valid until <time id="approval-until" datetime="`+until.Format(time.RFC3339)+`">`+until.Format("2006-01-02 15:04:05 MST")+`</time> (1 hour, as the rule sets)`)
	require.Contains(t, say, "If you deny:</strong> the request ends at once and the call does not run.")

	d := bob.post("/ui/requests/"+id+"/decide", url.Values{"decision": {"approve"}, "csrf": {csrf(t, p)}})
	require.Equal(t, http.StatusSeeOther, d.status, "%s", d.body)
	got, err := env.Backend.Requests().Load(context.Background(), id)
	require.NoError(t, err)
	a := got.Result.Approval
	require.Equal(t, time.Hour, a.ApprovedUntil.Sub(a.ApprovedAt), "the approval lasts what the page said")
	done := bob.get("/ui/requests/" + id)
	require.NotContains(t, done.body, `id="approving"`, "decided: nothing left to explain")
	require.Contains(t, done.body, "approval valid until "+a.ApprovedUntil.UTC().Format("2006-01-02 15:04 MST"))

	dave := newBrowser(t, env.URL)
	require.Equal(t, http.StatusSeeOther, dave.signIn("dave", dev.Password).status)
	p = dave.get("/ui/requests/" + repo)
	say = strings.Join(strings.Fields(section(t, p.body, `id="approving"`, "</div>")), " ")
	require.Contains(t, say, "yours is 1 of the 2 approvals still needed. When the last one is given, the call above, exactly as shown, runs once, right away.")
	require.Contains(t, say, "if that happens now, as the rule sets)")
}

// TestRowsShowKeyArgumentsAndOutcomesInWords: queue and history rows show
// the call's first arguments, marked like every value, cut short; outcomes
// are words, not reason codes; the audit trail's raw fields are folded away.
func TestRowsShowKeyArgumentsAndOutcomesInWords(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{Policy: []byte(displayPolicy)})
	expense := func(args map[string]any) string {
		return env.Submit(t, map[string]any{
			"subject":  map[string]any{"type": "user", "id": "alice"},
			"action":   map[string]any{"name": "tools/call"},
			"resource": map[string]any{"type": "mcp_tool", "id": "expense", "properties": map[string]any{"arguments": args}},
		})
	}
	id := expense(map[string]any{"to": "acct-\u202e199\u202c", "amount": 1200, "memo": strings.Repeat("x", 100), "zz": "fourth"})
	other := expense(map[string]any{"to": "acct-5"})

	bob := newBrowser(t, env.URL)
	require.Equal(t, http.StatusSeeOther, bob.signIn("bob", dev.Password).status)
	queue := bob.get("/ui/")
	row := section(t, queue.body, `data-request="`+id+`"`, "</li>")
	require.Contains(t, row, `<span class="args"><span class="arg"><span class="arg-name"><bdi class="val">amount</bdi></span> <bdi class="val">1,200</bdi></span>`)
	require.Contains(t, row, `<span class="arg-name"><bdi class="val">memo</bdi></span> <bdi class="val">`+strings.Repeat("x", 47)+`</bdi>&hellip;</span>`, "long values are cut, the ellipsis outside the value")
	require.Contains(t, row, `<bdi class="val">acct-<mark class="hidden-char" title="U+202E RIGHT-TO-LEFT OVERRIDE: bidirectional formatting">U+202E</mark>199`, "marked")
	require.Contains(t, row, "and 1 more")
	require.NotContains(t, row, "fourth")
	require.Empty(t, rawHidden(queue.body))

	p := bob.get("/ui/requests/" + id)
	require.Equal(t, http.StatusSeeOther, bob.post("/ui/requests/"+id+"/decide", url.Values{"decision": {"deny"}, "csrf": {csrf(t, p)}}).status)
	require.Equal(t, http.StatusSeeOther, bob.post("/ui/requests/"+other+"/decide", url.Values{"decision": {"approve"}, "csrf": {csrf(t, p)}}).status)

	hist := bob.get("/ui/history")
	denied := section(t, hist.body, `data-live="`+id+`"`, "</tr>")
	require.Contains(t, denied, `>Denied by approver</span>`)
	require.NotContains(t, denied, "denied_by_approver", "no reason codes")
	require.Contains(t, denied, `<bdi class="val">1,200</bdi>`, "history rows show the key arguments")
	approved := section(t, hist.body, `data-live="`+other+`"`, "</tr>")
	require.Contains(t, approved, `>Approved</span>`)
	require.Contains(t, approved, `<bdi class="val">acct-5</bdi>`)

	page := bob.get("/ui/requests/" + id).body
	require.Contains(t, section(t, page, `id="status"`, "</span>"), ">Denied by approver")
	require.NotContains(t, page[:strings.Index(page, `<ol class="audit">`)], "denied_by_approver", "the code stays in the folded audit fields")
	audit := section(t, page, `<ol class="audit">`, "</ol>")
	require.Contains(t, audit, `<details class="raw"><summary>Recorded fields</summary>`)
	require.NotContains(t, audit, "<details class=\"raw\" open", "folded away")
	require.Equal(t, strings.Count(audit, "<li>"), strings.Count(audit, "<details"), "every entry's fields are folded")
}

// TestErrorMessagesTakeFocus: every error message a page shows is the
// focus target the page script moves to (id="error", focusable), and a
// failed sign-in does not autofocus the user name instead.
func TestErrorMessagesTakeFocus(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{})
	b := newBrowser(t, env.URL)
	failed := b.signIn("bob", "wrong")
	require.Equal(t, http.StatusUnauthorized, failed.status)
	require.Contains(t, failed.body, `<p class="error" role="alert" id="error" tabindex="-1">Wrong user name or password.`)
	require.NotContains(t, failed.body, "autofocus")
	require.Contains(t, b.get("/ui/login").body, "autofocus", "without an error the user name has the focus")

	require.Equal(t, http.StatusSeeOther, b.signIn("bob", dev.Password).status)
	nf := b.get("/ui/requests/arq_00000000000000000000000000")
	require.Equal(t, http.StatusNotFound, nf.status)
	require.Contains(t, nf.body, `class="error" role="alert" id="error" tabindex="-1"`)
}
