package pep_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/ratelimit"
	"github.com/omcp/arap/pep"
	"github.com/omcp/arap/webhook"
)

func connect(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// receiver is one replica's callback endpoint: a verifier on the shared
// pep.webhook_ids, in front of a handler that counts what reaches it and
// answers status (holding each call until proceed is closed, if set).
type receiver struct {
	pool    *pgxpool.Pool
	srv     *httptest.Server
	calls   *atomic.Int32
	status  *atomic.Int32
	proceed chan struct{}
}

func startReceiver(t *testing.T, url, secret string, calls *atomic.Int32, proceed chan struct{}) *receiver {
	t.Helper()
	rc := &receiver{pool: connect(t, url), calls: calls, status: &atomic.Int32{}, proceed: proceed}
	rc.status.Store(http.StatusNoContent)
	v, err := webhook.NewVerifier(secret)
	require.NoError(t, err)
	v.Replay = &pep.WebhookIDs{DB: rc.pool}
	rc.srv = httptest.NewServer(v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if proceed != nil {
			select {
			case <-proceed:
			case <-r.Context().Done():
			}
		}
		w.WriteHeader(int(rc.status.Load()))
	})))
	t.Cleanup(rc.srv.Close)
	return rc
}

// delivery is one signed callback, sent as is (a copy) any number of times.
type delivery struct {
	id, sig string
	ts      int64
	body    []byte
}

func sign(t *testing.T, secret, id string) delivery {
	key, err := webhook.ParseSecret(secret)
	require.NoError(t, err)
	d := delivery{id: id, ts: time.Now().Unix(), body: []byte(`{"state":"task","task":{"id":"arq_1","status":"approved"}}`)}
	d.sig = webhook.Sign(key, d.id, d.ts, d.body)
	return d
}

func (d delivery) send(url string) (int, error) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(d.body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(webhook.HeaderID, d.id)
	req.Header.Set(webhook.HeaderTimestamp, strconv.FormatInt(d.ts, 10))
	req.Header.Set(webhook.HeaderSignature, d.sig)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// TestWebhookReplayAcrossReplicas: copies of one signed delivery sent at
// once to two replicas sharing one database reach the handler exactly once
// (the winner is held until every other copy has been answered, so a copy
// checked before the winner finished would get through too), the others
// answered 409 (being handled); after a restart a copy is answered 200
// (handled: the sender lost our answer) without reaching the handler again;
// a failed handling releases the id.
func TestWebhookReplayAcrossReplicas(t *testing.T) {
	url := dbtest.URL(t)
	secret := webhook.NewSecret()
	var calls atomic.Int32
	proceed := make(chan struct{})
	a := startReceiver(t, url, secret, &calls, proceed)
	b := startReceiver(t, url, secret, &calls, proceed)

	const copies = 8
	d := sign(t, secret, "msg_twin")
	results := make(chan int, copies)
	for i := range copies {
		go func() {
			code, err := d.send([]*receiver{a, b}[i%2].srv.URL)
			if err != nil {
				t.Error(err)
			}
			results <- code
		}()
	}
	release := sync.OnceFunc(func() { close(proceed) })
	defer release()
	var codes []int
	timeout := time.After(30 * time.Second)
	for len(codes) < copies {
		if len(codes) == copies-1 {
			release()
		}
		select {
		case c := <-results:
			codes = append(codes, c)
		case <-timeout:
			t.Fatalf("only %d of %d copies answered: more than one reached the handler (%v)", len(codes), copies, codes)
		}
	}
	sort.Ints(codes)
	require.Equal(t, []int{204, 409, 409, 409, 409, 409, 409, 409}, codes)
	require.EqualValues(t, 1, calls.Load(), "exactly one copy handled")

	// Restart: both replicas go away; a new one on the same database knows
	// the id was handled: a copy, even freshly signed (the sender's retry
	// after it lost our answer), is answered 2xx and not handled again, so
	// the sender stops retrying.
	a.srv.Close()
	a.pool.Close()
	b.srv.Close()
	b.pool.Close()
	var after atomic.Int32
	c := startReceiver(t, url, secret, &after, nil)
	code, err := sign(t, secret, "msg_twin").send(c.srv.URL)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	require.Zero(t, after.Load())

	// A failed handling on one replica releases the id: the sender's retry,
	// on the other replica, is handled; then it is remembered.
	d2 := startReceiver(t, url, secret, &after, nil)
	c.status.Store(http.StatusInternalServerError)
	code, err = sign(t, secret, "msg_fails_once").send(c.srv.URL)
	require.NoError(t, err)
	require.Equal(t, http.StatusInternalServerError, code)
	code, err = sign(t, secret, "msg_fails_once").send(d2.srv.URL)
	require.NoError(t, err)
	require.Equal(t, http.StatusNoContent, code, "the retry after a failure is not a replay")
	code, err = sign(t, secret, "msg_fails_once").send(c.srv.URL)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "handled now")
	require.EqualValues(t, 2, after.Load())
}

// TestWebhookIDsClaimIsAtomic: claims of one id released at once from two
// pools (two replicas) are won exactly once, round after round.
func TestWebhookIDsClaimIsAtomic(t *testing.T) {
	url := dbtest.URL(t)
	stores := []*pep.WebhookIDs{{DB: connect(t, url)}, {DB: connect(t, url)}}
	const rounds, claimers = 30, 16
	for round := range rounds {
		id := "msg_round_" + strconv.Itoa(round)
		var won atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range claimers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				ok, err := stores[i%2].Claim(context.Background(), id, time.Now().Add(time.Minute))
				if err != nil {
					t.Error(err)
				}
				if ok {
					won.Add(1)
				}
			}()
		}
		close(start)
		wg.Wait()
		require.EqualValues(t, 1, won.Load(), "round %d", round)
	}
}

// TestWebhookIDsExpireAndPurge: a claim lasts until its time; then the id
// can be claimed again (a redelivery by hand, days later) and the purge
// deletes it.
func TestWebhookIDsExpireAndPurge(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	s := &pep.WebhookIDs{DB: db, Now: func() time.Time { return now }}
	ok, err := s.Claim(ctx, "msg_1", now.Add(10*time.Minute))
	require.NoError(t, err)
	require.True(t, ok)
	now = now.Add(9 * time.Minute)
	ok, err = s.Claim(ctx, "msg_1", now.Add(10*time.Minute))
	require.NoError(t, err)
	require.False(t, ok, "still claimed")
	n, err := s.Purge(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a live claim is kept")
	now = now.Add(time.Minute)
	ok, err = s.Claim(ctx, "msg_1", now.Add(10*time.Minute))
	require.NoError(t, err)
	require.True(t, ok, "an expired claim is taken over")
	now = now.Add(10 * time.Minute)
	n, err = s.Purge(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
}

// TestWebhookStoreDownRefusesCallbacks: when the replay memory cannot be
// reached, a callback is not handled unchecked; the sender is told to retry.
func TestWebhookStoreDownRefusesCallbacks(t *testing.T) {
	secret := webhook.NewSecret()
	var calls atomic.Int32
	rc := startReceiver(t, dbtest.URL(t), secret, &calls, nil)
	rc.pool.Close()
	code, err := sign(t, secret, "msg_db_down").send(rc.srv.URL)
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Zero(t, calls.Load())
}

// frontEnd builds one replica of the real MCP server on the shared database
// (the gate's backend is never reached).
func frontEnd(t *testing.T, url, secret string, perMinute int) string {
	t.Helper()
	db := connect(t, url)
	g, err := pep.NewGate(pep.Config{DB: db, Backend: &arapclient.Client{BaseURL: "http://127.0.0.1:1", Token: "unused"},
		MasterKey: make([]byte, 32), Tools: pep.DemoTools()})
	require.NoError(t, err)
	// A fixed clock for the budget, so that no window ends mid-test.
	counters := ratelimit.NewCounters(db, pep.RateCounters)
	counters.Now = func() time.Time { return time.Date(2030, 1, 1, 0, 0, 10, 0, time.UTC) }
	srv, err := pep.NewServer(g, pep.ServerOptions{Name: "test", Version: "0", WebhookSecrets: []string{secret},
		RequestsPerMinute: perMinute, Counters: counters})
	require.NoError(t, err)
	h := httptest.NewServer(srv)
	t.Cleanup(h.Close)
	return h.URL
}

// TestFrontEndReplicasShareLimitsAndReplayMemory: the real front-end keeps
// its per-caller budget and its callback replay memory in the database, so
// two replicas enforce one budget and refuse each other's webhook ids.
func TestFrontEndReplicasShareLimitsAndReplayMemory(t *testing.T) {
	url := dbtest.URL(t)
	secret := webhook.NewSecret()
	a, b := frontEnd(t, url, secret, 3), frontEnd(t, url, secret, 3)
	setup := connect(t, url)
	g, err := pep.NewGate(pep.Config{DB: setup, Backend: &arapclient.Client{BaseURL: "http://127.0.0.1:1"}, MasterKey: make([]byte, 32), Tools: pep.DemoTools()})
	require.NoError(t, err)
	require.NoError(t, g.Callers().Create(context.Background(), "alice-agent", "alice-token-0123", pep.Principal{SubjectType: "user", SubjectID: "alice", ActorID: "agent:demo"}))

	for i := range 3 {
		status, body := post(t, []string{a, b}[i%2]+pep.PathMCP, "Bearer alice-token-0123")
		require.Equal(t, http.StatusOK, status, body)
	}
	for _, base := range []string{a, b} {
		req, err := http.NewRequest(http.MethodPost, base+pep.PathMCP, bytes.NewReader([]byte(`{}`)))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer alice-token-0123")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		var out map[string]string
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		resp.Body.Close()
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
		require.NotEmpty(t, resp.Header.Get("Retry-After"))
		require.Equal(t, "rate_limited", out["error"])
	}

	d := sign(t, secret, "msg_front")
	code, err := d.send(a + pep.PathCallback)
	require.NoError(t, err)
	require.Equal(t, http.StatusNoContent, code)
	code, err = d.send(b + pep.PathCallback)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "the other replica knows the id was handled: answered, not handled again")
}
