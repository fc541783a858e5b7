package slackapp_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/requests"
	"github.com/omcp/arap/slackapp"
)

// startWith is start with another policy.
func startWith(t *testing.T, policy string) *env {
	f := startSlack(t, members...)
	e := backendtest.Start(t, backendtest.Options{Policy: []byte(policy),
		Slack: &slackapp.Config{Token: "xoxb-test", SigningSecret: secret, APIURL: f.URL()}})
	return &env{Env: e, slack: f}
}

// allText is every text object of a message, one a line.
func allText(bs []block) string {
	var b strings.Builder
	for _, tx := range texts(bs) {
		b.WriteString(tx.Text + "\n")
	}
	return b.String()
}

// TestToolNameHiddenCharactersMarked: a hidden character in the tool's
// name (a bidi override, a zero-width space) is shown as its marker in the
// header, the "asks to run" line and the warning, as one in an argument
// is; the raw character is in no block and not in the notification text.
func TestToolNameHiddenCharactersMarked(t *testing.T) {
	e := startWith(t, `version: 1
rules:
  - name: any_tool
    match: {resource_type: mcp_tool}
    effect: request
    approval: {groups: [treasury]}
`)
	e.Submit(t, toolCall("wire\u202e_trans\u200bfer", map[string]any{"to": "acct-1"}))
	const marked = "wire<U+202E>_trans<U+200B>fer"
	for _, c := range e.slack.wait(t, 2, "chat.postMessage", nil) {
		bs := blocksOf(t, c)
		require.Equal(t, "header", bs[0].Type)
		require.Equal(t, "Request for "+marked, bs[0].Text.Text)
		all := allText(bs)
		require.Contains(t, all, "user alice, through agent:demo, asks to run "+marked+".")
		require.Contains(t, all, "WARNING: this request contains hidden or look-alike characters")
		require.Contains(t, all, "• U+202E RIGHT-TO-LEFT OVERRIDE (bidirectional formatting) in the tool\n")
		require.Contains(t, all, "• U+200B ZERO WIDTH SPACE (invisible character) in the tool\n")
		for _, ch := range []string{"\u202e", "\u200b"} {
			require.NotContains(t, c.Form["blocks"]+c.Form["text"], ch)
		}
		require.Equal(t, "Approval needed: Request for wire&lt;U+202E&gt;_trans&lt;U+200B&gt;fer", c.Form["text"])
	}
}

// TestCompatibilityCharactersMarked (issue 39): an argument in fullwidth
// forms ("ｃ－１２３") is shown with each character's marker in the blocks,
// each code point is listed in the warning, ordinary Japanese and accented
// text beside it is left as it is, and no raw fullwidth character is in any
// block or the notification text.
func TestCompatibilityCharactersMarked(t *testing.T) {
	e := startWith(t, `version: 1
rules:
  - name: any_tool
    match: {resource_type: mcp_tool}
    effect: request
    approval: {groups: [treasury]}
`)
	const to, memo = "\uff43\uff0d\uff11\uff12\uff13", "東京タワー、Zürich café"
	e.Submit(t, toolCall("expense", map[string]any{"to": to, "memo": memo}))
	for _, c := range e.slack.wait(t, 2, "chat.postMessage", nil) {
		all := allText(blocksOf(t, c))
		require.Contains(t, all, "  to: <U+FF43><U+FF0D><U+FF11><U+FF12><U+FF13>\n")
		require.Contains(t, all, "  memo: "+memo+"\n")
		require.Contains(t, all, "WARNING: this request contains hidden or look-alike characters")
		require.Contains(t, all, "• U+FF43 FULLWIDTH LATIN SMALL LETTER C (NFKC “c”) (compatibility character) in argument “to”\n")
		require.Contains(t, all, "• U+FF0D FULLWIDTH HYPHEN-MINUS (NFKC “-”) (compatibility character) in argument “to”\n")
		require.Contains(t, all, "• U+FF11 FULLWIDTH DIGIT ONE (NFKC “1”) (compatibility character) in argument “to”\n")
		require.Contains(t, all, "• U+FF12 FULLWIDTH DIGIT TWO (NFKC “2”) (compatibility character) in argument “to”\n")
		require.Contains(t, all, "• U+FF13 FULLWIDTH DIGIT THREE (NFKC “3”) (compatibility character) in argument “to”\n")
		require.NotContains(t, all, "in argument “memo”")
		for _, r := range to {
			require.NotContains(t, c.Form["blocks"]+c.Form["text"], string(r), "%U is in no block raw", r)
		}
	}
}

// markupPolicy puts <, &, " and ' in the rule's title and description
// and names a client with them, whose vote puts them in the lead line.
const markupPolicy = `version: 1
rules:
  - name: markup
    match: {resource_type: mcp_tool}
    effect: request
    display:
      title: 'Title <h1>&"''t'
      description: 'Why <i>&"''w'
    approval:
      quorum: 2
      groups: [treasury]
      clients: ['<c>&"''q']
`

// TestMarkupAsItIs: <, & and quotes in the tool name, the subject, the
// agent, every argument name and value, the title, the description, a
// warning's place and the lead line reach Slack as they are, in plain_text
// (which Slack shows literally: no formatting, link or mention), and the
// notification text (mrkdwn off) has &, < and > escaped as Slack requires.
func TestMarkupAsItIs(t *testing.T) {
	e := startWith(t, markupPolicy)
	ctx := context.Background()
	id := e.Submit(t, map[string]any{
		"subject": map[string]any{"type": "user", "id": `s<u>&"'s`, "properties": map[string]any{"act": map[string]any{"sub": `agent:<a>&"'a`}}},
		"action":  map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": `tool<b>&"'x`, "properties": map[string]any{"arguments": map[string]any{
			`name<n>&"'n`:         `value<v>&"'v`,
			`block`:               map[string]any{"k": `nested<j>&'j`},
			"hid\u202eden<h>&\"'": "x",
		}}},
	})
	shown := []string{
		"Title <h1>&\"'t\n", "Why <i>&\"'w\n", `user s<u>&"'s, through agent:<a>&"'a, asks to run tool<b>&"'x.`,
		"name<n>&\"'n: value<v>&\"'v\n", `"k": "nested<j>&'j"`, "hid<U+202E>den<h>&\"': x\n",
		"in argument “hid<U+202E>den<h>&\"'” (in its name)\n",
	}
	check := func(c call, lead string) {
		t.Helper()
		bs := blocksOf(t, c)
		all := allText(bs)
		for _, want := range append([]string{lead + "\n"}, shown...) {
			require.Contains(t, all, want)
		}
		for _, tx := range texts(bs) {
			if tx.Type != "button" { // a button's label is ours
				require.Equal(t, "plain_text", tx.Type, "%q", tx.Text)
			}
		}
		require.Equal(t, "false", c.Form["mrkdwn"])
		require.NotContains(t, c.Form["text"], "<")
		require.Contains(t, c.Form["text"], "Title &lt;h1&gt;&amp;\"'t")
	}
	for _, c := range e.slack.wait(t, 2, "chat.postMessage", nil) {
		check(c, "A request waits for your decision.")
		require.Equal(t, "Approval needed: Title &lt;h1&gt;&amp;\"'t", c.Form["text"])
	}

	cl, _, err := clients.NewStore(e.Pool).Create(ctx, clients.New{Name: `<c>&"'q`, Scopes: []string{"decide"}, Kind: "itsm"}, "test")
	require.NoError(t, err)
	_, err = e.Backend.Requests().Decide(ctx, requests.ClientVoter(cl.ID, cl.Name, cl.Kind), id, requests.Decision{Approve: true})
	require.NoError(t, err)
	for _, c := range e.slack.wait(t, 2, "chat.update", nil) {
		check(c, `client:<c>&"'q approved this request; it still waits for more decisions.`)
		require.Equal(t, "client:&lt;c&gt;&amp;\"'q approved: Title &lt;h1&gt;&amp;\"'t", c.Form["text"])
	}
}

// TestDisabledApproverRefused: an approver disabled after being asked (the
// message was sent while they were active, and an earlier click of theirs
// was recorded) is refused at the click, with the reason, and nothing is
// recorded: the person is read from the directory at each click.
func TestDisabledApproverRefused(t *testing.T) {
	e := start(t)
	ctx := context.Background()
	first := e.Submit(t, toolCall("wire_transfer", map[string]any{"to": "acct-1", "amount": 50000}))
	e.slack.wait(t, 2, "chat.postMessage", nil)
	require.Equal(t, 200, e.press(t, "UCAROL", slackapp.ActionApprove, first))
	votes, _ := e.recorded(t, first)
	require.Len(t, votes, 1, "carol's click, while she is active, counts")

	id := e.Submit(t, toolCall("wire_transfer", map[string]any{"to": "acct-2", "amount": 50000}))
	e.slack.wait(t, 2, "chat.postMessage", func(c call) bool { return strings.Contains(c.Form["blocks"], "acct-2") })
	require.NoError(t, e.Backend.Directory().DisableUser(ctx, "carol", "test"))

	for i, action := range []string{slackapp.ActionApprove, slackapp.ActionDeny} {
		require.Equal(t, 200, e.press(t, "UCAROL", action, id))
		eph := e.slack.Calls("chat.postEphemeral", ephemeralTo("UCAROL"))
		require.Len(t, eph, 2+i, action)
		require.Equal(t, "Your decision was not recorded: your approver account is disabled.", eph[len(eph)-1].Form["text"], action)
		votes, events := e.recorded(t, id)
		require.Empty(t, votes, action)
		require.Empty(t, events, action)
		require.Equal(t, requests.Pending, status(t, e, id), action)
	}
}

// rawPost sends one HTTP/1.1 request written byte for byte (header lines
// in the given order, duplicates and spacing as given, which net/http's
// client would normalise) and returns the status.
func (e *env) rawPost(t *testing.T, headers []string, body []byte) int {
	t.Helper()
	host := strings.TrimPrefix(e.URL, "http://")
	conn, err := net.Dial("tcp", host)
	require.NoError(t, err)
	defer conn.Close()
	var b strings.Builder
	b.WriteString("POST /slack/interactivity HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n")
	for _, h := range headers {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n")
	b.Write(body)
	_, err = conn.Write([]byte(b.String()))
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	return resp.StatusCode
}

// TestReplayInAnotherSpelling: once a click is accepted, the same click
// is refused however its signature is spelled (the hex in upper or mixed
// case, padded with spaces, the header's name in lower case, the headers
// in another order, the signature header repeated), and nothing is done
// twice; the same holds when the first accepted spelling was upper case.
func TestReplayInAnotherSpelling(t *testing.T) {
	e := start(t)
	id := e.Submit(t, toolCall("wire_transfer", map[string]any{"to": "acct-991", "amount": 50000}))
	e.slack.wait(t, 2, "chat.postMessage", nil)
	ct := "Content-Type: application/x-www-form-urlencoded"
	mixed := func(s string) string { // every other hex letter upper case
		r := []byte(s)
		for i := range r {
			if i%2 == 0 && r[i] >= 'a' && r[i] <= 'f' {
				r[i] -= 'a' - 'A'
			}
		}
		return string(r)
	}

	for i, first := range []string{"lower", "upper"} {
		// A click by someone no approver matches: each accepted click is
		// answered with one ephemeral message, so a second answer shows a
		// replay acted on; nothing is recorded either way.
		body := click("UMAL", []string{slackapp.ActionDeny, slackapp.ActionApprove}[i], id) // another click each time
		now := time.Now().Unix()
		ts := strconv.FormatInt(now, 10)
		sig := sign(secret, now, body)
		hexSig := strings.TrimPrefix(sig, "v0=")
		spell := map[string]string{"lower": sig, "upper": "v0=" + strings.ToUpper(hexSig)}
		before := len(e.slack.Calls("chat.postEphemeral", ephemeralTo("UMAL")))
		require.Equal(t, 200, e.rawPost(t, []string{ct, "X-Slack-Request-Timestamp: " + ts, "X-Slack-Signature: " + spell[first]}, body), first)
		require.Len(t, e.slack.Calls("chat.postEphemeral", ephemeralTo("UMAL")), before+1, first)

		for name, headers := range map[string][]string{
			"lower case":          {ct, "X-Slack-Request-Timestamp: " + ts, "X-Slack-Signature: " + sig},
			"upper case":          {ct, "X-Slack-Request-Timestamp: " + ts, "X-Slack-Signature: v0=" + strings.ToUpper(hexSig)},
			"mixed case":          {ct, "X-Slack-Request-Timestamp: " + ts, "X-Slack-Signature: v0=" + mixed(hexSig)},
			"padded":              {ct, "X-Slack-Request-Timestamp:   " + ts + "  ", "X-Slack-Signature: \t " + sig + " \t"},
			"header name case":    {ct, "x-slack-request-timestamp: " + ts, "x-slack-signature: v0=" + strings.ToUpper(hexSig)},
			"header order":        {"X-Slack-Signature: v0=" + strings.ToUpper(hexSig), "X-Slack-Request-Timestamp: " + ts, ct},
			"repeated signature":  {ct, "X-Slack-Request-Timestamp: " + ts, "X-Slack-Signature: v0=" + strings.ToUpper(hexSig), "X-Slack-Signature: " + sig},
			"repeated, then junk": {ct, "X-Slack-Request-Timestamp: " + ts, "X-Slack-Signature: " + mixed(sig), "X-Slack-Signature: v0=00"},
		} {
			require.Equal(t, 401, e.rawPost(t, headers, body), "%s after %s", name, first)
		}
		require.Len(t, e.slack.Calls("chat.postEphemeral", ephemeralTo("UMAL")), before+1, "no replay after %s is acted on", first)
	}
	votes, events := e.recorded(t, id)
	require.Empty(t, votes)
	require.Empty(t, events)

	// The spellings are each accepted when new: the refusals above are
	// replays, not malformed requests.
	for i, spelling := range []func(string) string{strings.ToUpper, func(s string) string { return s }} {
		body := click("UMAL", slackapp.ActionDeny, fmt.Sprint(id, i))
		now := time.Now().Unix()
		hexSig := strings.TrimPrefix(sign(secret, now, body), "v0=")
		require.Equal(t, 200, e.rawPost(t, []string{ct, "x-slack-request-timestamp: " + strconv.FormatInt(now, 10),
			"X-Slack-Signature:  v0=" + spelling(hexSig) + " ", "X-Slack-Signature: v0=00"}, body))
	}
}
