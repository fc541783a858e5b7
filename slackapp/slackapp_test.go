package slackapp_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/directory"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/requests"
	"github.com/omcp/arap/slackapp"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

const secret = "8f742231b10e8888abcd99yyyzzz85a5"

// policy: a transfer needs two treasury people (bob, carol), chat allowed
// (no channels: every channel); a deletion takes decisions in the web UI
// only.
const policy = `version: 1
rules:
  - name: two_people
    match: {resource_id: wire_transfer}
    effect: request
    display:
      title: Treasury approval
    approval:
      quorum: 2
      require_humans: 2
      groups: [treasury]
  - name: web_only
    match: {resource_id: delete_repository}
    effect: request
    approval:
      groups: [platform]
      channels: [web]
`

// The workspace: the dev approvers, the requester alice, an outsider, and
// a member whose e-mail address (bob's) Slack has not confirmed.
var members = []member{
	{"UBOB", "bob@example.com", true}, {"UCAROL", "Carol@Example.com", true}, {"UDAVE", "dave@example.com", true},
	{"UERIN", "erin@example.com", true}, {"UALICE", "alice@example.com", true}, {"UMAL", "mallory@evil.example", true},
	{"UFAKEBOB", "bob@example.com", false},
}

type env struct {
	*backendtest.Env
	slack *fakeSlack
}

func start(t *testing.T) *env {
	f := startSlack(t, members...)
	e := backendtest.Start(t, backendtest.Options{Policy: []byte(policy),
		Slack: &slackapp.Config{Token: "xoxb-test", SigningSecret: secret, APIURL: f.URL()}})
	return &env{Env: e, slack: f}
}

func toolCall(tool string, args map[string]any) map[string]any {
	return callFor("alice", tool, args)
}

func callFor(subject, tool string, args map[string]any) map[string]any {
	return map[string]any{
		"subject":  map[string]any{"type": "user", "id": subject, "properties": map[string]any{"act": map[string]any{"sub": "agent:demo"}}},
		"action":   map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": tool, "properties": map[string]any{"arguments": args}},
	}
}

// click is a block_actions payload: member pressed action on request id's
// message, form-encoded as Slack sends it.
func click(member, action, id string) []byte {
	p := map[string]any{
		"type": "block_actions", "api_app_id": "A1", "trigger_id": "1.2.3", "response_url": "https://hooks.slack.invalid/actions/1",
		"team":      map[string]any{"id": "T1", "domain": "example"},
		"user":      map[string]any{"id": member, "username": strings.ToLower(member), "team_id": "T1"},
		"channel":   map[string]any{"id": "D" + member, "name": "directmessage"},
		"container": map[string]any{"type": "message", "message_ts": "1700000000.000001", "channel_id": "D" + member, "is_ephemeral": false},
		"actions": []any{map[string]any{"type": "button", "block_id": "arap_decide", "action_id": action, "value": id,
			"text": map[string]any{"type": "plain_text", "text": "Approve"}, "action_ts": "1700000001.000000"}},
	}
	b, _ := json.Marshal(p)
	return []byte(url.Values{"payload": {string(b)}}.Encode())
}

// sign is Slack's v0 signature of body at ts with key.
func sign(key string, ts int64, body []byte) string {
	mac := hmac.New(sha256.New, []byte(key))
	mac.Write([]byte("v0:" + strconv.FormatInt(ts, 10) + ":"))
	mac.Write(body)
	return "v0=" + hex.EncodeToString(mac.Sum(nil))
}

// post sends body to the interactivity endpoint with the given signature
// headers and returns the status.
func (e *env) post(t *testing.T, ts int64, signature string, body []byte) int {
	t.Helper()
	req, err := http.NewRequest("POST", e.URL+"/slack/interactivity", strings.NewReader(string(body)))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Slack-Request-Timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("X-Slack-Signature", signature)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// press sends a click signed as Slack signs it, now.
func (e *env) press(t *testing.T, member, action, id string) int {
	body := click(member, action, id)
	now := time.Now().Unix()
	return e.post(t, now, sign(secret, now, body), body)
}

// recorded is what a request holds: its votes and its vote.* audit events.
func (e *env) recorded(t *testing.T, id string) ([]requests.Vote, []audit.Record) {
	t.Helper()
	votes, err := e.Backend.Requests().Votes(context.Background(), id)
	require.NoError(t, err)
	chain, err := audit.Chain(context.Background(), e.Pool, id)
	require.NoError(t, err)
	var events []audit.Record
	for _, ev := range chain {
		if strings.HasPrefix(ev.Kind, "vote.") {
			events = append(events, ev)
		}
	}
	return votes, events
}

func to(member string) func(call) bool {
	return func(c call) bool { return c.Form["channel"] == member || c.Form["channel"] == "D"+member }
}

func ephemeralTo(member string) func(call) bool {
	return func(c call) bool { return c.Form["user"] == member }
}

func status(t *testing.T, e *env, id string) requests.Status {
	r, err := e.Backend.Requests().Load(context.Background(), id)
	require.NoError(t, err)
	return r.Status
}

// TestMessagePerApproverAndApproveInSlack: a new request sends one direct
// message to each eligible approver (bob, carol; never alice, the
// requester), found by e-mail, with the page's summary in plain_text, an
// Open link and Approve/Deny. bob's Approve is bob's human vote through
// channel slack (audit names it) and counts toward the quorum; carol's
// ends the request, and every message is then updated to the outcome with
// no buttons.
func TestMessagePerApproverAndApproveInSlack(t *testing.T) {
	e := start(t)
	id := e.Submit(t, toolCall("wire_transfer", map[string]any{"to": "acct-991", "amount": 50000}))

	posted := e.slack.wait(t, 2, "chat.postMessage", nil)
	var got []string
	for _, c := range posted {
		got = append(got, c.Form["channel"])
		bs := blocksOf(t, c)
		require.Equal(t, []string{slackapp.ActionOpen, slackapp.ActionApprove, slackapp.ActionDeny}, actions(bs))
		for _, b := range bs {
			for _, el := range b.Elements {
				if el.Type == "button" {
					require.Equal(t, id, el.Value)
				}
				if el.ActionID == slackapp.ActionOpen {
					require.Equal(t, e.URL+"/ui/requests/"+id, el.URL)
				}
			}
		}
		all := ""
		for _, tx := range texts(bs) {
			all += tx.Text + "\n"
		}
		for _, want := range []string{"Treasury approval", "user alice, through agent:demo, asks to run wire_transfer.", "amount: 50,000", "to: acct-991", "Rule two_people", "Time left: "} {
			require.Contains(t, all, want)
		}
		require.Equal(t, "Approval needed: Treasury approval", c.Form["text"])
	}
	require.ElementsMatch(t, []string{"UBOB", "UCAROL"}, got)
	lookups := e.slack.Calls("users.lookupByEmail", nil)
	require.Len(t, lookups, 2)

	require.Equal(t, 200, e.press(t, "UBOB", slackapp.ActionApprove, id))
	votes, events := e.recorded(t, id)
	require.Len(t, votes, 1)
	require.Equal(t, "user:bob", votes[0].Voter)
	require.Equal(t, "human", votes[0].Kind)
	require.Equal(t, "slack", votes[0].Channel)
	require.Len(t, events, 1)
	require.Equal(t, "user:bob", events[0].Actor)
	var data map[string]any
	require.NoError(t, json.Unmarshal(events[0].Data, &data))
	require.Equal(t, "slack", data["channel"])
	require.Equal(t, requests.Pending, status(t, e, id), "one of two approvals")
	eph := e.slack.Calls("chat.postEphemeral", ephemeralTo("UBOB"))
	require.Len(t, eph, 1)
	require.Contains(t, eph[0].Form["text"], "Your approval is recorded, as bob.")

	require.Equal(t, 200, e.press(t, "UCAROL", slackapp.ActionApprove, id))
	require.Equal(t, requests.Approved, status(t, e, id), "two human approvals through Slack meet the quorum")

	// Each approver's message ends up showing the outcome, without buttons.
	for _, m := range []string{"UBOB", "UCAROL"} {
		ended := e.slack.wait(t, 1, "chat.update", func(c call) bool {
			return to(m)(c) && strings.HasPrefix(c.Form["text"], "Request approved: ")
		})
		bs := blocksOf(t, ended[0])
		require.Empty(t, actions(bs), "an ended request's message has no buttons")
		require.Contains(t, texts(bs)[1].Text, "This request ended: approved.")
		var ts string
		for _, p := range posted {
			if p.Form["channel"] == m {
				ts = p.Form["_answered_ts"]
			}
		}
		require.Equal(t, ts, ended[0].Form["ts"], "the update is of the message posted for the request")
		require.Equal(t, "D"+m, ended[0].Form["channel"], "the update goes to the posted message's conversation")
	}
	// The requester is told of the outcome in a message of her own.
	e.slack.wait(t, 1, "chat.postMessage", func(c call) bool { return to("UALICE")(c) && strings.HasPrefix(c.Form["text"], "Request approved: ") })
	require.Empty(t, e.slack.Calls("chat.postMessage", func(c call) bool {
		return to("UALICE")(c) && strings.HasPrefix(c.Form["text"], "Approval needed")
	}), "the requester is not asked to decide")
}

// TestRefusedClicksRecordNothing: a click Slack's signature does not prove
// (another key, a stale timestamp, a replay of a signature already used, no
// signature) is 401 and changes nothing; a proven click by someone the
// request does not accept (the requester herself, a member no approver's
// e-mail matches, a member whose e-mail Slack has not confirmed, an
// approver of another group) is told why, ephemerally, and nothing is
// recorded.
func TestRefusedClicksRecordNothing(t *testing.T) {
	e := start(t)
	id := e.Submit(t, toolCall("wire_transfer", map[string]any{"to": "acct-991", "amount": 50000}))
	e.slack.wait(t, 2, "chat.postMessage", nil)
	nothing := func(what string) {
		t.Helper()
		votes, events := e.recorded(t, id)
		require.Empty(t, votes, what)
		require.Empty(t, events, what)
		require.Equal(t, requests.Pending, status(t, e, id), what)
	}

	body := click("UBOB", slackapp.ActionApprove, id)
	now := time.Now().Unix()
	require.Equal(t, 401, e.post(t, now, sign("not-the-secret", now, body), body), "forged signature")
	nothing("forged signature")
	stale := now - int64(6*time.Minute/time.Second)
	require.Equal(t, 401, e.post(t, stale, sign(secret, stale, body), body), "stale timestamp")
	nothing("stale timestamp")
	require.Equal(t, 401, e.post(t, now, "", body), "no signature")
	tampered := click("UBOB", slackapp.ActionDeny, id)
	require.Equal(t, 401, e.post(t, now, sign(secret, now, body), tampered), "a signature over another body")
	nothing("tampered body")
	require.Empty(t, e.slack.Calls("users.info", nil), "an unproven click reaches no further than the signature")

	// Refusals by the rule or the directory: an ephemeral reason each.
	for _, c := range []struct{ member, reason string }{
		{"UALICE", "user:alice is not among the deciders"},
		{"UMAL", "no approver has your Slack e-mail address"},
		{"UFAKEBOB", "no confirmed e-mail address"},
		{"UDAVE", "treasury"},
	} {
		require.Equal(t, 200, e.press(t, c.member, slackapp.ActionApprove, id), c.member)
		eph := e.slack.Calls("chat.postEphemeral", ephemeralTo(c.member))
		require.Len(t, eph, 1, c.member)
		require.Contains(t, eph[0].Form["text"], "Your decision was not recorded: ", c.member)
		require.Contains(t, eph[0].Form["text"], c.reason, c.member)
		require.Equal(t, "D"+c.member, eph[0].Form["channel"])
		nothing(c.member)
	}

	// A replay of a click the endpoint accepted: refused, not answered again.
	body = click("UMAL", slackapp.ActionDeny, id)
	now = time.Now().Unix()
	sig := sign(secret, now, body)
	require.Equal(t, 200, e.post(t, now, sig, body))
	before := len(e.slack.Calls("chat.postEphemeral", ephemeralTo("UMAL")))
	require.Equal(t, 401, e.post(t, now, sig, body), "replay")
	require.Len(t, e.slack.Calls("chat.postEphemeral", ephemeralTo("UMAL")), before, "a replay is not acted on")
	nothing("replay")

	// bob's own (proven) deny still works after all that.
	require.Equal(t, 200, e.press(t, "UBOB", slackapp.ActionDeny, id))
	require.Equal(t, requests.Denied, status(t, e, id))
}

// TestWebOnlyRuleNoButtons: a rule whose decisions come through the web UI
// only gets messages with the Open link and no Approve or Deny; a click on
// Approve crafted for it anyway (signed by Slack) is refused with the
// rule's reason, and nothing is recorded.
func TestWebOnlyRuleNoButtons(t *testing.T) {
	e := start(t)
	id := e.Submit(t, toolCall("delete_repository", map[string]any{"repo": "infra"}))
	posted := e.slack.wait(t, 2, "chat.postMessage", nil)
	for _, c := range posted {
		require.Equal(t, []string{slackapp.ActionOpen}, actions(blocksOf(t, c)), "no chat decisions on a web-only rule")
	}
	require.Equal(t, 200, e.press(t, "UDAVE", slackapp.ActionApprove, id))
	eph := e.slack.Calls("chat.postEphemeral", ephemeralTo("UDAVE"))
	require.Len(t, eph, 1)
	require.Contains(t, eph[0].Form["text"], "takes decisions only through the web UI (web), not the Slack app (slack)")
	votes, events := e.recorded(t, id)
	require.Empty(t, votes)
	require.Empty(t, events)
	require.Equal(t, requests.Pending, status(t, e, id))
}

// TestArgumentsCannotFormat: request text reaches Slack only as plain_text
// (no formatting, links or mentions), with hidden characters shown as the
// web UI's markers; the notification fallback has mrkdwn off and &, <, >
// escaped.
func TestArgumentsCannotFormat(t *testing.T) {
	e := start(t)
	evil := "<!channel> *urgent* <https://evil.example|click> acct\u202e1"
	id := e.Submit(t, toolCall("wire_transfer", map[string]any{"to": evil, "amount": 50000}))
	posted := e.slack.wait(t, 2, "chat.postMessage", nil)
	for _, c := range posted {
		bs := blocksOf(t, c)
		var found bool
		for _, tx := range texts(bs) {
			if strings.Contains(tx.Text, "<!channel>") || strings.Contains(tx.Text, "evil.example") {
				require.Equal(t, "plain_text", tx.Type, "request text in %q", tx.Text)
				found = true
			}
			if tx.Type == "mrkdwn" {
				require.Equal(t, "<"+e.URL+"/ui/requests/"+id+"|Open the request> (sign-in required)", tx.Text)
			}
		}
		require.True(t, found)
		all := ""
		for _, tx := range texts(bs) {
			all += tx.Text
		}
		require.Contains(t, all, "to: <!channel> *urgent* <https://evil.example|click> acct<U+202E>1")
		require.NotContains(t, all, "\u202e")
		require.Contains(t, all, "WARNING: this request contains hidden or look-alike characters")
		require.Equal(t, "false", c.Form["mrkdwn"])
	}
}

// TestBodyBounded: a body over slackapp.MaxBody is refused with 413 before
// it is read whole, signed or not.
func TestBodyBounded(t *testing.T) {
	e := start(t)
	body := []byte("payload=" + strings.Repeat("a", slackapp.MaxBody))
	now := time.Now().Unix()
	require.Equal(t, 413, e.post(t, now, sign(secret, now, body), body))
	require.Empty(t, e.slack.Calls("", nil))
}

// TestOffWithoutToken: without Slack configured the endpoint is 404 and
// nobody is messaged.
func TestOffWithoutToken(t *testing.T) {
	e := &env{Env: backendtest.Start(t, backendtest.Options{Policy: []byte(policy)}), slack: startSlack(t)}
	body := click("UBOB", slackapp.ActionApprove, "req_x")
	now := time.Now().Unix()
	require.Equal(t, 404, e.post(t, now, sign(secret, now, body), body))
}

// TestNoSelfApprovalInSlack: a request made for bob, a treasury approver,
// is not sent to bob, and his (signed) Approve on it is refused with the
// reason; only carol is asked.
func TestNoSelfApprovalInSlack(t *testing.T) {
	e := start(t)
	id := e.Submit(t, callFor("bob", "wire_transfer", map[string]any{"to": "acct-991", "amount": 50000}))
	posted := e.slack.wait(t, 1, "chat.postMessage", nil)
	require.Equal(t, "UCAROL", posted[0].Form["channel"])
	require.Equal(t, 200, e.press(t, "UBOB", slackapp.ActionApprove, id))
	eph := e.slack.Calls("chat.postEphemeral", ephemeralTo("UBOB"))
	require.Len(t, eph, 1)
	require.Contains(t, eph[0].Form["text"], "Your decision was not recorded: user:bob cannot decide a request made on their behalf or through them")
	votes, events := e.recorded(t, id)
	require.Empty(t, votes)
	require.Empty(t, events)
	require.Len(t, e.slack.Calls("chat.postMessage", to("UBOB")), 0, "bob is not asked to decide his own request")
}

// TestSharedAddressDecidesNothing: when two directory accounts have the
// e-mail address Slack confirmed (a local account and one from single
// sign-on, say), a click cannot be tied to one person and is refused.
func TestSharedAddressDecidesNothing(t *testing.T) {
	e := start(t)
	require.NoError(t, e.Backend.Directory().CreateUser(context.Background(),
		directory.User{Name: "carol2", Email: "carol@example.com"}, "", "test"))
	id := e.Submit(t, toolCall("wire_transfer", map[string]any{"to": "acct-991", "amount": 50000}))
	e.slack.wait(t, 1, "chat.postMessage", nil)
	require.Equal(t, 200, e.press(t, "UCAROL", slackapp.ActionApprove, id))
	eph := e.slack.Calls("chat.postEphemeral", ephemeralTo("UCAROL"))
	require.Len(t, eph, 1)
	require.Contains(t, eph[0].Form["text"], "more than one approver account has your Slack e-mail address")
	votes, events := e.recorded(t, id)
	require.Empty(t, votes)
	require.Empty(t, events)
	require.Equal(t, requests.Pending, status(t, e, id))
}
