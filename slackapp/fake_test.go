package slackapp_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// member is a Slack workspace member the fake knows.
type member struct {
	ID, Email string
	Confirmed bool
}

// call is one Web API call the fake answered.
type call struct {
	Method string
	Form   map[string]string
}

// fakeSlack answers the Web API methods the app calls, with the JSON
// shapes Slack answers, and records every call.
type fakeSlack struct {
	srv     *httptest.Server
	mu      sync.Mutex
	calls   []call
	members []member
	nextTS  int
}

func startSlack(t *testing.T, members ...member) *fakeSlack {
	f := &fakeSlack{members: members}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

// URL is the API base URL (slack.OptionAPIURL).
func (f *fakeSlack) URL() string { return f.srv.URL + "/api/" }

func (f *fakeSlack) serve(w http.ResponseWriter, r *http.Request) {
	// The token comes as a bearer token or a form field, as slack-go sends
	// it per method.
	if r.ParseForm() != nil || r.Header.Get("Authorization") != "Bearer xoxb-test" && r.Form.Get("token") != "xoxb-test" {
		_ = json.NewEncoder(w).Encode(map[string]any{"ok": false, "error": "invalid_auth"})
		return
	}
	method := strings.TrimPrefix(r.URL.Path, "/api/")
	c := call{Method: method, Form: map[string]string{}}
	for k := range r.Form {
		c.Form[k] = r.Form.Get(k)
	}
	f.mu.Lock()
	f.nextTS++
	ts := fmt.Sprintf("1700000000.%06d", f.nextTS)
	c.Form["_answered_ts"] = ts // what a posting call was answered
	f.calls = append(f.calls, c)
	f.mu.Unlock()
	find := func(match func(member) bool) map[string]any {
		for _, m := range f.members {
			if match(m) {
				return map[string]any{"ok": true, "user": map[string]any{"id": m.ID, "team_id": "T1", "name": strings.Split(m.Email, "@")[0],
					"is_email_confirmed": m.Confirmed, "profile": map[string]any{"email": m.Email, "real_name": m.ID}}}
			}
		}
		return map[string]any{"ok": false, "error": "users_not_found"}
	}
	var out map[string]any
	switch method {
	case "users.lookupByEmail":
		out = find(func(m member) bool { return strings.EqualFold(m.Email, c.Form["email"]) })
	case "users.info":
		out = find(func(m member) bool { return m.ID == c.Form["user"] })
	case "chat.postMessage":
		// A DM to a member opens (or reuses) the conversation D<member>.
		out = map[string]any{"ok": true, "channel": "D" + c.Form["channel"], "ts": ts, "message": map[string]any{"text": c.Form["text"], "ts": ts}}
	case "chat.update":
		out = map[string]any{"ok": true, "channel": c.Form["channel"], "ts": c.Form["ts"], "text": c.Form["text"]}
	case "chat.postEphemeral":
		out = map[string]any{"ok": true, "message_ts": ts}
	default:
		out = map[string]any{"ok": false, "error": "unknown_method"}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// Calls returns the calls of method whose form matches keep.
func (f *fakeSlack) Calls(method string, keep func(call) bool) []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []call
	for _, c := range f.calls {
		if (method == "" || c.Method == method) && (keep == nil || keep(c)) {
			out = append(out, c)
		}
	}
	return out
}

// wait waits for n calls of method matching keep.
func (f *fakeSlack) wait(t *testing.T, n int, method string, keep func(call) bool) []call {
	t.Helper()
	var got []call
	require.Eventually(t, func() bool {
		got = f.Calls(method, keep)
		return len(got) >= n
	}, 20*time.Second, 20*time.Millisecond, "want %d %s calls; got %+v", n, method, f.Calls("", func(call) bool { return true }))
	return got
}

// block is the part of a Block Kit block the tests read.
type block struct {
	Type     string    `json:"type"`
	BlockID  string    `json:"block_id"`
	Text     *textObj  `json:"text"`
	Elements []element `json:"elements"`
}

type textObj struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type element struct {
	Type     string `json:"type"`
	ActionID string `json:"action_id"`
	Value    string `json:"value"`
	URL      string `json:"url"`
	// Text is a text object (buttons) or a string (a context block's
	// text elements).
	Text json.RawMessage `json:"text"`
}

func blocksOf(t *testing.T, c call) []block {
	t.Helper()
	var bs []block
	require.NoError(t, json.Unmarshal([]byte(c.Form["blocks"]), &bs), "blocks: %s", c.Form["blocks"])
	return bs
}

// actions are the action ids of the message's buttons.
func actions(bs []block) []string {
	var out []string
	for _, b := range bs {
		for _, e := range b.Elements {
			if e.Type == "button" {
				out = append(out, e.ActionID)
			}
		}
	}
	return out
}

// texts are the message's text objects.
func texts(bs []block) []textObj {
	var out []textObj
	for _, b := range bs {
		if b.Text != nil {
			out = append(out, *b.Text)
		}
		for _, e := range b.Elements {
			var to textObj
			if json.Unmarshal(e.Text, &to) == nil {
				out = append(out, to)
			} else if json.Unmarshal(e.Text, &to.Text) == nil {
				out = append(out, textObj{Type: e.Type, Text: to.Text})
			}
		}
	}
	return out
}
