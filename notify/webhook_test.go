package notify_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/callbacks"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/notify"
	"github.com/omcp/arap/requests"
	"github.com/omcp/arap/webhook"
)

// ticketPolicy is the seed policy with ITSM webhooks on two rules:
// delete_repository tells the "itsm" target only (no e-mail), and
// wire_transfer_large is left without a notify section.
func ticketPolicy(t *testing.T) []byte {
	p := string(dev.SeedPolicy())
	anchor := "      machines_may: [deny]   # automation may stop it, only people may grant\n"
	require.Contains(t, p, anchor)
	return []byte(strings.Replace(p, anchor, anchor+"    notify:\n      channels: [webhook]\n      webhooks: [itsm]\n", 1))
}

// received is one POST that reached the receiver.
type received struct {
	ID       string // webhook-id
	Body     string
	Verified bool
}

// receiver is a real HTTP server on loopback that checks each POST's
// Standard Webhooks signature with package webhook, as an ITSM flow would,
// and answers fail with 500 before answering 204.
type receiver struct {
	*httptest.Server
	secret string
	mu     sync.Mutex
	got    []received
	fail   int
}

func startReceiver(t *testing.T, secret string, fail int) *receiver {
	v, err := webhook.NewVerifier(secret)
	require.NoError(t, err)
	r := &receiver{fail: fail, secret: secret}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		_, verr := v.Verify(req.Header, body)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.got = append(r.got, received{ID: req.Header.Get(webhook.HeaderID), Body: string(body), Verified: verr == nil})
		if r.fail > 0 {
			r.fail--
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) all() []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]received(nil), r.got...)
}

// itsmTarget creates client "itsm-hooks" allowed to call the receiver on
// loopback (the dev/test allowance callbacks have), gives it a webhook
// secret, and a start function that creates target "itsm" at the receiver.
func itsmTarget(t *testing.T, env *backendtest.Env, fail int) *receiver {
	ctx := context.Background()
	cbs := env.Backend.Callbacks()
	c, _, err := env.Backend.Clients().Create(ctx, clients.New{Name: "itsm-hooks", Scopes: []string{clients.ScopeDecide}, Kind: clients.KindITSM,
		CallbackPrefixes: []string{"http://127.0.0.1:"}, CallbackNetworks: []string{clients.NetworkLoopback}}, "test")
	require.NoError(t, err)
	secret, err := cbs.RotateSecret(ctx, c.ID, 0, "", "test")
	require.NoError(t, err)
	rcv := startReceiver(t, secret, fail)
	_, err = targets(env).Create(ctx, "itsm", "itsm-hooks", rcv.URL+"/arap-events", "test")
	require.NoError(t, err)
	return rcv
}

// targets is the webhook target store, as arapctl webhooks uses it.
func targets(env *backendtest.Env) *callbacks.TargetStore { return callbacks.NewTargetStore(env.Pool) }

func waitPosts(t *testing.T, rcv *receiver, n int) []received {
	t.Helper()
	var got []received
	require.Eventually(t, func() bool { got = rcv.all(); return len(got) >= n }, 20*time.Second, 20*time.Millisecond, "want %d posts", n)
	return got
}

func voterOf(t *testing.T, env *backendtest.Env, name string) requests.Voter {
	u, err := env.Backend.Directory().User(context.Background(), name)
	require.NoError(t, err)
	return requests.UserVoter(u.Name, u.Identities(), u.Groups)
}

func deleteRepo(repo string) map[string]any {
	return map[string]any{
		"subject":  map[string]any{"type": "user", "id": "alice", "properties": map[string]any{"act": map[string]any{"sub": "agent:demo"}}},
		"action":   map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": "delete_repository", "properties": map[string]any{"arguments": map[string]any{"repo": repo}}},
	}
}

// webhookRows counts the webhook deliveries of request id, and how many
// were sent.
func webhookRows(t *testing.T, env *backendtest.Env, id string) (rows, sent int) {
	require.NoError(t, env.Pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE d.status = 'sent')
		FROM arap.notification_deliveries d JOIN arap.notification_events e ON e.id = d.event_id
		WHERE e.request_id = $1 AND d.channel = 'webhook'`, id).Scan(&rows, &sent))
	return rows, sent
}

// TestWebhookTargetGetsSignedEvents: a rule naming webhook target "itsm"
// makes one signed POST per event (created, each vote, including the one
// that ends it, and ended) with the
// documented payload, and nothing secret in it; the rule's notify section
// (webhook only) sends no e-mail.
func TestWebhookTargetGetsSignedEvents(t *testing.T) {
	sink := startSink(t)
	env := backendtest.Start(t, backendtest.Options{Mail: mailTo(sink), Policy: ticketPolicy(t)})
	rcv := itsmTarget(t, env, 0)
	ctx := context.Background()

	id := env.Submit(t, deleteRepo("infra"))
	waitPosts(t, rcv, 1)
	_, err := env.Backend.Requests().Decide(ctx, voterOf(t, env, "dave"), id, requests.Decision{Approve: true})
	require.NoError(t, err)
	waitPosts(t, rcv, 2)
	_, err = env.Backend.Requests().Decide(ctx, voterOf(t, env, "erin"), id, requests.Decision{Approve: true})
	require.NoError(t, err)
	waitPosts(t, rcv, 4)
	settled(t, env.Pool, id)
	got := rcv.all()
	require.Len(t, got, 4, "one POST per event")

	r, err := env.Backend.Requests().Load(ctx, id)
	require.NoError(t, err)
	var types, voters []string
	for _, g := range got {
		require.True(t, g.Verified, "signed with the client's webhook secret")
		var p map[string]any
		require.NoError(t, json.Unmarshal([]byte(g.Body), &p))
		require.Equal(t, p["id"].(string)+".itsm", g.ID, "webhook-id is the event id and the target")
		require.True(t, strings.HasPrefix(p["id"].(string), notify.EventIDPrefix))
		types = append(types, p["type"].(string))
		req := p["request"].(map[string]any)
		require.Equal(t, id, req["id"])
		require.Equal(t, env.URL+"/ui/requests/"+id, req["url"])
		require.Equal(t, "delete_repository", req["rule"])
		require.Equal(t, "Repository deletion", req["title"])
		require.Equal(t, "user alice", req["subject"])
		require.Equal(t, "agent:demo", req["agent"])
		require.Equal(t, "delete_repository", req["tool"])
		require.Equal(t, []any{map[string]any{"name": "repo", "value": "infra"}}, req["arguments"])
		require.Equal(t, r.ExpiresAt.UTC().Format(time.RFC3339Nano), req["expires_at"])
		switch p["type"] {
		case notify.TypeCreated:
			require.Equal(t, "pending", req["status"])
		case notify.TypeDecided:
			require.Equal(t, "pending", req["status"], "the status as of the event")
			d := p["decision"].(map[string]any)
			require.Equal(t, "approve", d["decision"])
			voters = append(voters, d["voter"].(string))
		case notify.TypeEnded:
			require.Equal(t, "approved", req["status"])
		}
		for _, s := range secrets(t, env.Pool, id) {
			require.NotContains(t, g.Body, s, "the payload carries a secret of the request")
		}
		for _, s := range []string{dev.PEPToken, dev.ITSMToken, rcv.secret, strings.TrimPrefix(rcv.secret, webhook.SecretPrefix), dev.PEPWebhookSecret, "eyJhbGciOiJFUzI1NiIs", `"binding_token"`, `"evaluation_id"`, `"approval":`, `"state":`, `"callback"`} {
			require.NotContains(t, g.Body, s)
		}
	}
	slices.Sort(types)
	require.Equal(t, []string{notify.TypeCreated, notify.TypeDecided, notify.TypeDecided, notify.TypeEnded}, types)
	slices.Sort(voters)
	require.Equal(t, []string{"user:dave", "user:erin"}, voters)
	rows, sent := webhookRows(t, env, id)
	require.Equal(t, 4, rows)
	require.Equal(t, 4, sent)
	for _, m := range sink.Messages() {
		require.NotContains(t, m.Text, id, "notify: [webhook] sends no e-mail")
	}
}

// TestWebhookRetriesUntilSuccess: the target answers 500 first; River
// retries the one delivery, under the same webhook-id, until it answers
// 2xx; one delivery row, sent after two attempts.
func TestWebhookRetriesUntilSuccess(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{Policy: ticketPolicy(t)})
	rcv := itsmTarget(t, env, 1)
	id := env.Submit(t, deleteRepo("infra"))
	got := waitPosts(t, rcv, 2)
	require.Equal(t, got[0].ID, got[1].ID, "a retry is the same message")
	require.Equal(t, got[0].Body, got[1].Body)
	require.Eventually(t, func() bool { _, sent := webhookRows(t, env, id); return sent == 1 }, 20*time.Second, 20*time.Millisecond)
	rows, _ := webhookRows(t, env, id)
	require.Equal(t, 1, rows, "exactly one delivery row")
	var attempts int
	require.NoError(t, env.Pool.QueryRow(context.Background(), `SELECT d.attempts FROM arap.notification_deliveries d
		JOIN arap.notification_events e ON e.id = d.event_id WHERE e.request_id = $1 AND d.channel = 'webhook'`, id).Scan(&attempts))
	require.Equal(t, 2, attempts)
	require.Len(t, rcv.all(), 2, "nothing more once it answered 2xx")
}

// TestWebhookTargetForbiddenAddress: a target URL that the client's
// callbacks could not use is refused at creation, by the callbacks' own
// check (a cloud metadata address, a loopback one for a client not allowed
// loopback); and one that was allowed when created but no longer is (the
// client's networks narrowed) is never POSTed to.
func TestWebhookTargetForbiddenAddress(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{Policy: ticketPolicy(t)})
	ctx := context.Background()
	cbs := env.Backend.Callbacks()
	c, _, err := env.Backend.Clients().Create(ctx, clients.New{Name: "public-only", Scopes: []string{clients.ScopeDecide}, Kind: clients.KindITSM,
		CallbackPrefixes: []string{"http://169.254.169.254/", "http://127.0.0.1:", "http://10.0.0.1/"}}, "test")
	require.NoError(t, err)
	_, err = cbs.RotateSecret(ctx, c.ID, 0, "", "test")
	require.NoError(t, err)
	for _, u := range []string{"http://169.254.169.254/latest/meta-data", "http://127.0.0.1:9/hook", "http://10.0.0.1/hook"} {
		_, err := targets(env).Create(ctx, "itsm", "public-only", u, "test")
		require.ErrorContains(t, err, "callback endpoint refused", u)
	}
	targets, err := targets(env).List(ctx)
	require.NoError(t, err)
	require.Empty(t, targets, "a refused target is not stored")

	rcv := itsmTarget(t, env, 0)
	_, err = env.Pool.Exec(ctx, `UPDATE arap.api_clients SET callback_networks = '{}' WHERE name = 'itsm-hooks'`)
	require.NoError(t, err)
	id := env.Submit(t, deleteRepo("infra"))
	require.Eventually(t, func() bool {
		var lastErr string
		_ = env.Pool.QueryRow(ctx, `SELECT coalesce(d.last_error, '') FROM arap.notification_deliveries d
			JOIN arap.notification_events e ON e.id = d.event_id WHERE e.request_id = $1 AND d.channel = 'webhook'`, id).Scan(&lastErr)
		return strings.Contains(lastErr, "a loopback address, which this client is not allowed to call")
	}, 20*time.Second, 20*time.Millisecond)
	require.Empty(t, rcv.all(), "nothing reached the forbidden address")
}

// TestRuleWithoutNotifyUnchanged: a rule without a notify section e-mails
// its deciders as before and tells no webhook target, even when one exists.
func TestRuleWithoutNotifyUnchanged(t *testing.T) {
	sink := startSink(t)
	env := backendtest.Start(t, backendtest.Options{Mail: mailTo(sink), Policy: ticketPolicy(t)})
	rcv := itsmTarget(t, env, 0)
	id := env.Submit(t, wireCall("alice", "acct-991", 50000))
	require.Equal(t, []string{"bob@example.com", "carol@example.com"}, recipients(waitFor(t, sink, 2, about(id))))
	settled(t, env.Pool, id)
	rows, _ := webhookRows(t, env, id)
	require.Zero(t, rows)
	require.Empty(t, rcv.all())
}

// TestWebhookPayloadHiddenCharacters: a hidden character in an argument is
// listed in request.hidden_characters, as the page warns of it.
func TestWebhookPayloadHiddenCharacters(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{Policy: []byte(`version: 1
rules:
  - name: expense
    match: {resource_id: expense}
    effect: request
    approval: {groups: [treasury]}
    notify: {channels: [webhook], webhooks: [itsm]}
`)})
	rcv := itsmTarget(t, env, 0)
	env.Submit(t, map[string]any{
		"subject":  map[string]any{"type": "user", "id": "alice"},
		"action":   map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": "expense", "properties": map[string]any{"arguments": map[string]any{"to": "acct-\u202e199\uff11\uff11"}}},
	})
	var p notify.Payload
	require.NoError(t, json.Unmarshal([]byte(waitPosts(t, rcv, 1)[0].Body), &p))
	require.Equal(t, []notify.HiddenCharacter{{Code: "U+202E", Name: "RIGHT-TO-LEFT OVERRIDE", Where: "argument “to”", Count: 1},
		{Code: "U+FF11", Name: "FULLWIDTH DIGIT ONE (NFKC “1”)", Where: "argument “to”", Count: 2}}, p.Request.HiddenCharacters)
	require.Equal(t, "acct-\u202e199\uff11\uff11", p.Request.Arguments[0].Value, "the value is unchanged")
	require.Empty(t, p.Request.Agent)
	require.Empty(t, p.Request.Title)
}
