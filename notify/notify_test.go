package notify_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/mailsink"
	"github.com/omcp/arap/internal/summary"
	"github.com/omcp/arap/migrations"
	"github.com/omcp/arap/notify"
	"github.com/omcp/arap/requests"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func startSink(t *testing.T) *mailsink.Sink {
	sink, err := mailsink.Start(mailsink.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sink.Close() })
	return sink
}

func mailTo(sink *mailsink.Sink) *notify.EmailConfig {
	return &notify.EmailConfig{URL: "smtp+insecure://" + sink.Addr(), From: "arap@example.com"}
}

func wireCall(subject, to string, amount float64) map[string]any {
	return map[string]any{
		"subject":  map[string]any{"type": "user", "id": subject, "properties": map[string]any{"act": map[string]any{"sub": "agent:demo"}}},
		"action":   map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": "wire_transfer", "properties": map[string]any{"arguments": map[string]any{"to": to, "amount": amount}}},
	}
}

// waitFor waits until the sink holds n messages matching keep, and returns them.
func waitFor(t *testing.T, sink *mailsink.Sink, n int, keep func(mailsink.Message) bool) []mailsink.Message {
	t.Helper()
	var got []mailsink.Message
	require.Eventually(t, func() bool {
		got = got[:0]
		for _, m := range sink.Messages() {
			if keep(m) {
				got = append(got, m)
			}
		}
		return len(got) >= n
	}, 20*time.Second, 20*time.Millisecond, "want %d messages", n)
	return got
}

func about(id string) func(mailsink.Message) bool {
	return func(m mailsink.Message) bool { return strings.Contains(m.Text, "/ui/requests/"+id) }
}

func recipients(ms []mailsink.Message) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.To...)
	}
	slices.Sort(out)
	return out
}

// secrets are what no message may carry: the request's evaluation id and,
// once approved, its approval id and state. (Its binding token is not
// stored; requireNoSecrets looks for any token the backend signs.)
func secrets(t *testing.T, pool *pgxpool.Pool, id string) []string {
	var evalID, approvalID, state string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT evaluation_id,
		coalesce(result->'approval'->>'id', ''), coalesce(result->'approval'->>'state', '') FROM arap.requests WHERE id = $1`, id).
		Scan(&evalID, &approvalID, &state))
	out := []string{evalID}
	for _, s := range []string{approvalID, state} {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

func requireNoSecrets(t *testing.T, pool *pgxpool.Pool, id string, ms []mailsink.Message) {
	t.Helper()
	for _, m := range ms {
		for _, s := range secrets(t, pool, id) {
			require.NotContains(t, string(m.Raw), s, "a message carries a secret of the request")
			require.NotContains(t, m.Text+m.HTML+m.Subject, s)
		}
		// The start of every JWS the backend signs, {"alg":"ES256",
		// (binding tokens, approval states).
		require.NotContains(t, m.Text+m.HTML+m.Subject, "eyJhbGciOiJFUzI1NiIs", "a message carries a signed token")
	}
}

// TestCreatedTellsEachEligibleApprover: a new request sends one e-mail to
// each person who may decide it (treasury: bob, carol), none to the
// requester, with what the request page shows first and a link carrying
// only the request id, in a plain-text and an HTML part.
func TestCreatedTellsEachEligibleApprover(t *testing.T) {
	sink := startSink(t)
	env := backendtest.Start(t, backendtest.Options{Mail: mailTo(sink)})
	id := env.Submit(t, wireCall("alice", "acct-991", 50000))

	got := waitFor(t, sink, 2, about(id))
	require.Equal(t, []string{"bob@example.com", "carol@example.com"}, recipients(got))
	r, err := env.Backend.Requests().Load(context.Background(), id)
	require.NoError(t, err)
	sum := summary.Of(r, time.Now())
	for _, m := range got {
		require.Equal(t, "Approval needed: "+sum.Heading(), m.Subject)
		for _, want := range []string{"user alice, through agent:demo, asks to run wire_transfer.", "amount: 50,000", "to: acct-991",
			"Rule wire_transfer_large", "Time left: ", sum.Title, "Open the request (sign-in required): " + env.URL + "/ui/requests/" + id + "\n"} {
			require.Contains(t, m.Text, want)
		}
		for _, want := range []string{string(summary.Show(sum.Subject)), string(summary.Show("agent:demo")), string(summary.Show("50,000")),
			`<a href="` + env.URL + `/ui/requests/` + id + `">`} {
			require.Contains(t, m.HTML, want)
		}
		require.Equal(t, "arap@example.com", m.Header.Get("From")[1:len(m.Header.Get("From"))-1])
		var event string
		require.NoError(t, env.Pool.QueryRow(context.Background(), `SELECT id FROM arap.notification_events WHERE request_id = $1 AND kind = 'created'`, id).Scan(&event))
		name, _, _ := strings.Cut(m.To[0], "@")
		require.Equal(t, "<"+event+"."+name+"@example.com>", m.Header.Get("Message-Id"),
			"the delivery's own id, the same on a re-send, so a receiver can drop the repeat")
	}
	requireNoSecrets(t, env.Pool, id, got)
	// One delivery per recipient and channel, each sent once.
	require.Eventually(t, func() bool {
		var sent int
		_ = env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM arap.notification_deliveries d
			JOIN arap.notification_events e ON e.id = d.event_id WHERE e.request_id = $1 AND d.status = 'sent' AND d.attempts = 1`, id).Scan(&sent)
		return sent == 2
	}, 10*time.Second, 20*time.Millisecond)
}

// TestOutcomeTellsRequester: when bob approves, alice (the requester) is
// told the outcome, as is carol; nothing carries the approval's id or state.
// A vote that does not end a request tells the other deciders.
func TestOutcomeTellsRequester(t *testing.T) {
	sink := startSink(t)
	env := backendtest.Start(t, backendtest.Options{Mail: mailTo(sink)})
	ctx := context.Background()
	dir := env.Backend.Directory()
	voter := func(name string) requests.Voter {
		u, err := dir.User(ctx, name)
		require.NoError(t, err)
		return requests.UserVoter(u.Name, u.Identities(), u.Groups)
	}

	id := env.Submit(t, wireCall("alice", "acct-991", 50000))
	waitFor(t, sink, 2, about(id))
	_, err := env.Backend.Requests().Decide(ctx, voter("bob"), id, requests.Decision{Approve: true})
	require.NoError(t, err)
	ended := waitFor(t, sink, 3, func(m mailsink.Message) bool {
		return about(id)(m) && strings.HasPrefix(m.Subject, "Request approved: ")
	})
	require.Equal(t, []string{"alice@example.com", "bob@example.com", "carol@example.com"}, recipients(ended))
	for _, m := range ended {
		if m.To[0] == "alice@example.com" {
			require.Contains(t, m.Text, "Your request ended: approved.")
		}
	}
	requireNoSecrets(t, env.Pool, id, sink.Messages())

	// delete_repository needs two platform approvals: dave's vote tells erin.
	del := map[string]any{
		"subject":  map[string]any{"type": "user", "id": "alice", "properties": map[string]any{"act": map[string]any{"sub": "agent:demo"}}},
		"action":   map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": "delete_repository", "properties": map[string]any{"arguments": map[string]any{"repo": "infra"}}},
	}
	id2 := env.Submit(t, del)
	waitFor(t, sink, 2, about(id2))
	_, err = env.Backend.Requests().Decide(ctx, voter("dave"), id2, requests.Decision{Approve: true})
	require.NoError(t, err)
	vote := waitFor(t, sink, 1, func(m mailsink.Message) bool {
		return about(id2)(m) && strings.HasPrefix(m.Subject, "user:dave approved: ")
	})
	require.Equal(t, []string{"erin@example.com"}, recipients(vote), "the voter is not told of their own vote")
}

// TestNoSelfApprovalNotice: a request made for bob (a treasury approver)
// asks carol only: bob may not decide it, so he is not asked to.
func TestNoSelfApprovalNotice(t *testing.T) {
	sink := startSink(t)
	env := backendtest.Start(t, backendtest.Options{Mail: mailTo(sink)})
	id := env.Submit(t, wireCall("bob", "acct-991", 50000))
	settled(t, env.Pool, id)
	got := waitFor(t, sink, 1, about(id))
	require.Equal(t, []string{"carol@example.com"}, recipients(got))
}

// settled waits until request id's events are fanned out and none of
// their deliveries is pending.
func settled(t *testing.T, pool *pgxpool.Pool, id string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var open int
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT
			(SELECT count(*) FROM arap.notification_events WHERE request_id = $1 AND fanned_out_at IS NULL) +
			(SELECT count(*) FROM arap.notification_deliveries d JOIN arap.notification_events e ON e.id = d.event_id
				WHERE e.request_id = $1 AND d.status = 'pending')`, id).Scan(&open))
		return open == 0
	}, 20*time.Second, 20*time.Millisecond)
}

// TestHiddenCharactersMarked: a hidden character in an argument is marked
// in the e-mail as on the page (the page's own renderer), and the raw
// character is in no part.
func TestHiddenCharactersMarked(t *testing.T) {
	sink := startSink(t)
	env := backendtest.Start(t, backendtest.Options{Mail: mailTo(sink), Policy: []byte(`version: 1
rules:
  - name: expense
    match: {resource_id: expense}
    effect: request
    display: {title: Expense approval}
    approval: {groups: [treasury]}
`)})
	to := "acct-\u202e199"
	id := env.Submit(t, map[string]any{
		"subject":  map[string]any{"type": "user", "id": "alice"},
		"action":   map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": "expense", "properties": map[string]any{"arguments": map[string]any{"to": to}}},
	})
	for _, m := range waitFor(t, sink, 2, about(id)) {
		require.Contains(t, m.Text, "to: acct-<U+202E>199")
		require.Contains(t, m.Text, "WARNING: this request contains hidden or look-alike characters")
		require.Contains(t, m.HTML, string(summary.Show(to)), "the HTML part marks it as the page does")
		require.Contains(t, m.HTML, `<mark class="hidden-char"`)
		require.NotContains(t, m.Text+m.HTML+m.Subject, "\u202e")
	}
}

// TestCompatibilityCharactersMarked (issue 39): an argument in fullwidth
// forms ("ｃ－１２３") is marked character by character in the text and
// HTML parts, each code point is listed in the warning of both, and
// ordinary Japanese and accented text beside it is left as it is.
func TestCompatibilityCharactersMarked(t *testing.T) {
	sink := startSink(t)
	env := backendtest.Start(t, backendtest.Options{Mail: mailTo(sink), Policy: []byte(`version: 1
rules:
  - name: expense
    match: {resource_id: expense}
    effect: request
    display: {title: Expense approval}
    approval: {groups: [treasury]}
`)})
	const to, memo = "\uff43\uff0d\uff11\uff12\uff13", "東京タワー、Zürich café"
	id := env.Submit(t, map[string]any{
		"subject":  map[string]any{"type": "user", "id": "alice"},
		"action":   map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": "expense", "properties": map[string]any{"arguments": map[string]any{"to": to, "memo": memo}}},
	})
	for _, m := range waitFor(t, sink, 2, about(id)) {
		require.Contains(t, m.Text, "  to: <U+FF43><U+FF0D><U+FF11><U+FF12><U+FF13>\n")
		require.Contains(t, m.Text, "  memo: "+memo+"\n", "ordinary text as it is")
		require.Contains(t, m.Text, "WARNING: this request contains hidden or look-alike characters")
		for _, line := range []string{
			"  - U+FF43 FULLWIDTH LATIN SMALL LETTER C (NFKC “c”) (compatibility character) in argument “to”\n",
			"  - U+FF0D FULLWIDTH HYPHEN-MINUS (NFKC “-”) (compatibility character) in argument “to”\n",
			"  - U+FF11 FULLWIDTH DIGIT ONE (NFKC “1”) (compatibility character) in argument “to”\n",
			"  - U+FF12 FULLWIDTH DIGIT TWO (NFKC “2”) (compatibility character) in argument “to”\n",
			"  - U+FF13 FULLWIDTH DIGIT THREE (NFKC “3”) (compatibility character) in argument “to”\n",
		} {
			require.Contains(t, m.Text, line)
		}
		require.NotContains(t, m.Text, "in argument “memo”")
		require.Contains(t, m.HTML, "<dd>"+string(summary.Show(to))+"</dd>", "the HTML part marks it as the page does")
		require.Contains(t, m.HTML, `<mark class="hidden-char" title="U+FF43 FULLWIDTH LATIN SMALL LETTER C (NFKC “c”): compatibility character">U+FF43</mark><mark`)
		require.Contains(t, m.HTML, `<h2>This request contains hidden or look-alike characters</h2>`)
		require.Contains(t, m.HTML, `U+FF13</mark> FULLWIDTH DIGIT THREE (NFKC “3”) (compatibility character) in <bdi class="val">argument “to”</bdi>`)
		require.Contains(t, m.HTML, "<dd><bdi class=\"val\">"+memo+"</bdi></dd>")
		for _, r := range to {
			require.NotContains(t, m.Text+m.HTML+m.Subject, string(r), "%U is in no part raw", r)
		}
	}
}

// TestNoChannelsTellsNobody: a rule with notify: {channels: []} (arguments
// that must not leave arap) sends nothing, though e-mail is configured and
// its approvers have addresses: the empty list survives being stored with
// the request, and is not read back as "every channel".
func TestNoChannelsTellsNobody(t *testing.T) {
	sink := startSink(t)
	env := backendtest.Start(t, backendtest.Options{Mail: mailTo(sink), Policy: []byte(`version: 1
rules:
  - name: secret
    match: {resource_id: secret}
    effect: request
    approval: {groups: [treasury]}
    notify: {channels: []}
  - name: expense
    match: {resource_id: expense}
    effect: request
    approval: {groups: [treasury]}
`)})
	call := func(tool string) map[string]any {
		return map[string]any{
			"subject":  map[string]any{"type": "user", "id": "alice"},
			"action":   map[string]any{"name": "tools/call"},
			"resource": map[string]any{"type": "mcp_tool", "id": tool, "properties": map[string]any{"arguments": map[string]any{"to": "acct-1"}}},
		}
	}
	quiet := env.Submit(t, call("secret"))
	told := env.Submit(t, call("expense"))
	settled(t, env.Pool, quiet)
	waitFor(t, sink, 2, about(told)) // e-mail works, and had its time
	settled(t, env.Pool, told)
	for _, m := range sink.Messages() {
		require.False(t, about(quiet)(m), "told of a request whose rule has no channels: %s", m.Subject)
	}
	var deliveries int
	require.NoError(t, env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM arap.notification_deliveries d
		JOIN arap.notification_events e ON e.id = d.event_id WHERE e.request_id = $1`, quiet).Scan(&deliveries))
	require.Zero(t, deliveries)
	// The dispatch settles an event nobody can be told of itself: no
	// fan-out job is ever enqueued for it (told's was).
	fanouts := func(id string) (n int) {
		require.NoError(t, env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM river.river_job j
			JOIN arap.notification_events e ON e.id = j.args->>'event_id' WHERE j.kind = 'notify.fanout' AND e.request_id = $1`, id).Scan(&n))
		return n
	}
	require.Zero(t, fanouts(quiet))
	require.Positive(t, fanouts(told))
}

// TestUndecodableNotifySectionStopsNothing: an event whose request's stored
// notify section does not decode gets a fan-out job of its own, and the
// events after it in the same dispatch are dispatched as usual; it does not
// roll back every dispatch that takes it.
func TestUndecodableNotifySectionStopsNothing(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{}) // no channel for people: events are settled by the dispatch
	ctx := context.Background()
	bad := env.Submit(t, wireCall("alice", "acct-1", 50000))
	good := env.Submit(t, wireCall("alice", "acct-2", 50000))
	settled(t, env.Pool, bad)
	settled(t, env.Pool, good)
	now := time.Now()
	_, err := env.Pool.Exec(ctx, `UPDATE arap.requests SET approval_policy = jsonb_set(approval_policy, '{notify}', '{"channels": "email"}') WHERE id = $1`, bad)
	require.NoError(t, err)
	_, err = env.Pool.Exec(ctx, `INSERT INTO arap.notification_events (id, request_id, kind, created_at, dispatched_at)
		VALUES ('nev_test_bad', $1, 'reminder', $3, NULL), ('nev_test_good', $2, 'reminder', $4, NULL)`, bad, good, now.Add(-time.Hour), now)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var fanned bool
		require.NoError(t, env.Pool.QueryRow(ctx, `SELECT fanned_out_at IS NOT NULL FROM arap.notification_events WHERE id = 'nev_test_good'`).Scan(&fanned))
		return fanned
	}, 20*time.Second, 20*time.Millisecond, "the event after the undecodable one is dispatched and settled")
	var jobs int
	require.NoError(t, env.Pool.QueryRow(ctx, `SELECT count(*) FROM river.river_job WHERE kind = 'notify.fanout' AND args->>'event_id' = 'nev_test_bad'`).Scan(&jobs))
	require.Equal(t, 1, jobs, "the undecodable one has its own fan-out job")
}

// notifier builds a notify.Service on env's database that delivers to sink,
// as another replica would.
func notifier(t *testing.T, env *backendtest.Env, pool *pgxpool.Pool, jobs requests.JobInserter, sink *mailsink.Sink) *notify.Service {
	email, err := notify.NewEmail(*mailTo(sink))
	require.NoError(t, err)
	s, err := notify.NewService(notify.Config{DB: pool, Jobs: jobs, Requests: env.Backend.Requests(), Directory: env.Backend.Directory(),
		Channels: []notify.Channel{email}, PageURL: func(id string) string { return "https://arap.example/ui/requests/" + id }})
	require.NoError(t, err)
	return s
}

// TestCrashBetweenCommitAndSend: the outbox row commits and the process
// dies before anything is dispatched or sent; a fresh backend (a fresh River
// client) started afterwards on the database sends the notices.
func TestCrashBetweenCommitAndSend(t *testing.T) {
	sink := startSink(t)
	env := backendtest.Start(t, backendtest.Options{}) // notifications off: nothing else sends
	ctx := context.Background()
	id := env.Submit(t, wireCall("alice", "acct-991", 50000))
	pool, err := pgxpool.New(ctx, env.DBURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// The submission's own event (notify is always on, for webhook targets)
	// is fanned out to nobody: this backend has no e-mail, the rule no
	// webhooks. Only the "crashing" event below is left to send.
	settled(t, env.Pool, id)
	require.NoError(t, env.Backend.Stop(ctx)) // no worker of the backend's may take the job

	// The "crashing" process: an insert-only River client; the change's
	// transaction records the event and commits; then nothing runs.
	inserter, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: migrations.RiverSchema})
	require.NoError(t, err)
	crashing := notifier(t, env, pool, inserter, sink)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		crashing.QueueTx(b, requests.Event{Kind: requests.EventCreated, RequestID: id})
		return tx.SendBatch(ctx, b).Close()
	}))
	require.Empty(t, sink.Messages())

	var events int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM arap.notification_events WHERE request_id = $1 AND fanned_out_at IS NULL`, id).Scan(&events))
	require.Equal(t, 1, events, "the outbox row committed")

	// The restart: a fresh backend (a fresh River client) on the database.
	backendtest.Start(t, backendtest.Options{Mail: mailTo(sink), Join: env})
	got := waitFor(t, sink, 2, func(m mailsink.Message) bool { return strings.Contains(m.Text, id) })
	require.Equal(t, []string{"bob@example.com", "carol@example.com"}, recipients(got))
}

// TestDispatchEnqueuesEachEventOnce: the events changes record get their
// fan-out job from the dispatch, one each, however many dispatchers run at
// once, in as many batches as it takes.
func TestDispatchEnqueuesEachEventOnce(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{})
	ctx := context.Background()
	id := env.Submit(t, wireCall("alice", "acct-991", 50000))
	settled(t, env.Pool, id)
	require.NoError(t, env.Backend.Stop(ctx)) // its dispatch must not run meanwhile
	pool, err := pgxpool.New(ctx, env.DBURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	inserter, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: migrations.RiverSchema})
	require.NoError(t, err)
	svc := notifier(t, env, pool, inserter, startSink(t))
	const dispatchers = 4
	const n = dispatchers*notify.DispatchBatch + 10 // more than one batch each
	events := make([]requests.Event, n)
	for i := range events {
		events[i] = requests.Event{Kind: requests.EventDecided, RequestID: id, Voter: fmt.Sprintf("user:v%d", i), Decision: "approve"}
	}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		svc.QueueTx(b, events...)
		return tx.SendBatch(ctx, b).Close()
	}))
	// An event as a version before the dispatch writes it (it enqueues its
	// own fan-out): the column's default counts it dispatched.
	_, err = pool.Exec(ctx, `INSERT INTO arap.notification_events (id, request_id, kind, created_at) VALUES ('nev_older', $1, 'created', now())`, id)
	require.NoError(t, err)

	var wg sync.WaitGroup
	got := make([]int, dispatchers)
	errs := make([]error, dispatchers)
	for i := range dispatchers {
		wg.Go(func() { got[i], errs[i] = svc.DispatchPending(ctx) })
	}
	wg.Wait()
	total := 0
	for i := range dispatchers {
		require.NoError(t, errs[i])
		total += got[i]
	}
	require.Equal(t, n, total, "each event dispatched by exactly one dispatcher")

	var jobs, distinct, undispatched int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT j.args->>'event_id')
		FROM river.river_job j JOIN arap.notification_events e ON e.id = j.args->>'event_id'
		WHERE j.kind = $1 AND e.request_id = $2 AND e.kind = 'decided'`, notify.FanoutArgs{}.Kind(), id).Scan(&jobs, &distinct))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM arap.notification_events WHERE dispatched_at IS NULL`).Scan(&undispatched))
	require.Equal(t, n, distinct, "every event has a fan-out job (and the older version's event none from the dispatch)")
	require.Equal(t, n, jobs, "no event has two")
	require.Zero(t, undispatched)

	again, err := svc.DispatchPending(ctx)
	require.NoError(t, err)
	require.Zero(t, again, "nothing is dispatched twice")
}

// TestTwoReplicasNotifyOnce: two backends on one database, many requests
// submitted to both: every (event, recipient, channel) is sent exactly
// once. Running a fan-out and every delivery again afterwards (a retried
// job, a duplicate) sends nothing more.
func TestTwoReplicasNotifyOnce(t *testing.T) {
	sink := startSink(t)
	a := backendtest.Start(t, backendtest.Options{Mail: mailTo(sink)})
	b := backendtest.Start(t, backendtest.Options{Mail: mailTo(sink), Join: a})
	const n = 10
	var ids []string
	for i := range n {
		env := a
		if i%2 == 1 {
			env = b
		}
		ids = append(ids, env.Submit(t, wireCall("alice", fmt.Sprintf("acct-%d", i), 50000)))
	}
	waitFor(t, sink, 2*n, func(mailsink.Message) bool { return true })
	ctx := context.Background()
	count := func() int {
		var sent int
		require.NoError(t, a.Pool.QueryRow(ctx, `SELECT count(*) FROM arap.notification_deliveries WHERE status = 'sent'`).Scan(&sent))
		return sent
	}
	if !assert.Eventually(t, func() bool { return count() == 2*n }, 10*time.Second, 20*time.Millisecond) {
		t.Fatal(dump(t, a.Pool))
	}

	// Again, by hand: every fan-out and every delivery.
	inserter, err := river.NewClient(riverpgxv5.New(a.Pool), &river.Config{Schema: migrations.RiverSchema})
	require.NoError(t, err)
	again := notifier(t, a, a.Pool, inserter, sink)
	rows, err := a.Pool.Query(ctx, `SELECT d.event_id, d.recipient, d.channel FROM arap.notification_deliveries d`)
	require.NoError(t, err)
	deliveries, err := pgx.CollectRows(rows, pgx.RowToStructByPos[notify.DeliverArgs])
	require.NoError(t, err)
	for _, d := range deliveries {
		require.NoError(t, again.Fanout(ctx, d.EventID))
		require.NoError(t, again.Deliver(ctx, d, false))
	}
	require.Len(t, sink.Messages(), 2*n)
	per := map[string]int{}
	for _, m := range sink.Messages() {
		for _, id := range ids {
			if about(id)(m) {
				per[id+" "+m.To[0]]++
			}
		}
	}
	require.Len(t, per, 2*n)
	for k, c := range per {
		require.Equal(t, 1, c, k)
	}
}

func dump(t *testing.T, pool *pgxpool.Pool) string {
	rows, err := pool.Query(context.Background(), `SELECT kind, state, attempt, errors::text FROM river.river_job WHERE kind LIKE 'notify%' LIMIT 4`)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var a, b, d string
		var c int
		require.NoError(t, rows.Scan(&a, &b, &c, &d))
		out = append(out, fmt.Sprint(a, b, c, d))
	}
	return strings.Join(out, "\n")
}

// TestDevMailOnlyInDevMode: a backend that is not `arapd dev` has no
// /dev/mail, notifications on or off.
func TestDevMailOnlyInDevMode(t *testing.T) {
	sink := startSink(t)
	for _, o := range []backendtest.Options{{}, {Mail: mailTo(sink)}} {
		env := backendtest.Start(t, o)
		for _, path := range []string{"/dev/mail", "/dev/mail.json"} {
			resp, err := http.Get(env.URL + path)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusNotFound, resp.StatusCode, path)
		}
	}
}

// TestDispatchWritesAQuietEventOnce: the dispatch settles an event nobody can
// be told of with the one UPDATE that marks it dispatched. Every UPDATE of
// an event writes a new row version and, since dispatched_at is in an
// index's predicate, new index entries: two UPDATEs per event were a fifth
// of the WAL records of a gated call's submission.
func TestDispatchWritesAQuietEventOnce(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{}) // no channel for people: every event is quiet
	ctx := context.Background()
	_, err := env.Pool.Exec(ctx, `CREATE TABLE public.event_writes (id text NOT NULL);
		CREATE FUNCTION public.count_event_write() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO public.event_writes VALUES (NEW.id); RETURN NEW; END $$;
		CREATE TRIGGER count_event_writes AFTER UPDATE ON arap.notification_events
		FOR EACH ROW EXECUTE FUNCTION public.count_event_write()`)
	require.NoError(t, err)
	id := env.Submit(t, wireCall("alice", "acct-991", 50000))
	settled(t, env.Pool, id)
	var events, writes int
	require.NoError(t, env.Pool.QueryRow(ctx, `SELECT count(*), (SELECT count(*) FROM public.event_writes w JOIN arap.notification_events e ON e.id = w.id
		WHERE e.request_id = $1) FROM arap.notification_events WHERE request_id = $1`, id).Scan(&events, &writes))
	require.Equal(t, 1, events)
	require.Equal(t, 1, writes, "the created event was updated once: dispatched and settled together")
}
