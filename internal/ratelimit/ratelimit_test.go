package ratelimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/ratelimit"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

var table = pgx.Identifier{"arap", "rate_counters"}

// clock is a settable clock shared by the replicas of a test.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.t = c.t.Add(d) }

func newClock() *clock {
	// Ten seconds into a minute, so a test has 50 s of window left.
	return &clock{t: time.Date(2030, 1, 2, 3, 4, 10, 0, time.UTC)}
}

func pool(t *testing.T, url string) *pgxpool.Pool {
	p, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// replica is one server process: its own pool and limiter on the shared
// database, behind a real HTTP server.
type replica struct {
	pool *pgxpool.Pool
	lim  *ratelimit.Limiter
	srv  *httptest.Server
}

func startReplica(t *testing.T, url string, c *clock, limit int) *replica {
	rp := &replica{pool: pool(t, url)}
	counters := ratelimit.NewCounters(rp.pool, table)
	counters.Now = c.Now
	var err error
	rp.lim, err = counters.NewLimiter("client", limit, time.Minute)
	require.NoError(t, err)
	h := rp.lim.Middleware(func(r *http.Request) string { return r.Header.Get("X-Key") },
		func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTooManyRequests) },
		func(w http.ResponseWriter, _ *http.Request, err error) {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		},
	)(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	rp.srv = httptest.NewServer(h)
	t.Cleanup(rp.srv.Close)
	return rp
}

func send(base, key string) (*http.Response, error) {
	req, err := http.NewRequest("GET", base, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	resp.Body.Close()
	return resp, nil
}

func get(t *testing.T, base, key string) *http.Response {
	resp, err := send(base, key)
	require.NoError(t, err)
	return resp
}

// TestConcurrentReplicasShareOneBudget: many concurrent requests for one key,
// spread over two server processes on one database, are admitted exactly
// Limit times, not Limit per replica (nor more through a race).
func TestConcurrentReplicasShareOneBudget(t *testing.T) {
	url := dbtest.URL(t)
	c := newClock()
	const limit, total = 37, 240
	replicas := []*replica{startReplica(t, url, c, limit), startReplica(t, url, c, limit)}
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range total {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp, err := send(replicas[i%2].srv.URL, "pep")
			if err != nil {
				t.Error(err)
				return
			}
			switch resp.StatusCode {
			case http.StatusNoContent:
				admitted.Add(1)
			case http.StatusTooManyRequests:
				if ra := resp.Header.Get("Retry-After"); ra != "50" {
					t.Errorf("Retry-After %q, want the 50 s left in the window", ra)
				}
				refused.Add(1)
			default:
				t.Errorf("status %d", resp.StatusCode)
			}
		}()
	}
	close(start)
	wg.Wait()
	require.EqualValues(t, limit, admitted.Load(), "exactly the budget, across both replicas")
	require.EqualValues(t, total-limit, refused.Load())
	var n int
	require.NoError(t, replicas[0].pool.QueryRow(context.Background(), `SELECT n FROM arap.rate_counters WHERE key = 'client:pep'`).Scan(&n))
	require.Equal(t, limit, n, "refusals are not counted")
}

// TestLimitSurvivesRestart: a replica started later (or restarted) on the
// same database sees the budget already spent.
func TestLimitSurvivesRestart(t *testing.T) {
	url := dbtest.URL(t)
	c := newClock()
	first := startReplica(t, url, c, 3)
	for range 3 {
		require.Equal(t, http.StatusNoContent, get(t, first.srv.URL, "pep").StatusCode)
	}
	first.srv.Close()
	first.pool.Close()

	restarted := startReplica(t, url, c, 3)
	require.Equal(t, http.StatusTooManyRequests, get(t, restarted.srv.URL, "pep").StatusCode)
}

// TestKeysAndLimitersAreIndependent: each key has its own budget, and two
// limiters sharing a table do not share keys.
func TestKeysAndLimitersAreIndependent(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	counters := ratelimit.NewCounters(dbtest.New(t), table)
	counters.Now = c.Now
	a, err := counters.NewLimiter("a", 2, time.Minute)
	require.NoError(t, err)
	b, err := counters.NewLimiter("b", 2, time.Minute)
	require.NoError(t, err)
	take := func(l *ratelimit.Limiter, key string) bool {
		res, err := l.Take(ctx, key)
		require.NoError(t, err)
		return res.Allowed
	}
	require.True(t, take(a, "x"))
	require.True(t, take(a, "x"))
	require.False(t, take(a, "x"))
	require.True(t, take(a, "y"), "another key has its own budget")
	require.True(t, take(b, "x"), "another limiter has its own keys")
	require.True(t, take(b, "x"))
	require.False(t, take(b, "x"))

	// A key too long to store is hashed, still with its own budget.
	long := string(make([]byte, 4096))
	require.True(t, take(a, long))
	require.True(t, take(a, long))
	require.False(t, take(a, long))
	require.True(t, take(a, long+"!"))
}

// TestWindowRollsOver: a spent budget comes back when the window ends, and
// the refusal says when.
func TestWindowRollsOver(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	counters := ratelimit.NewCounters(dbtest.New(t), table)
	counters.Now = c.Now
	l, err := counters.NewLimiter("w", 2, time.Minute)
	require.NoError(t, err)
	for range 2 {
		res, err := l.Take(ctx, "k")
		require.NoError(t, err)
		require.True(t, res.Allowed)
	}
	c.Add(49 * time.Second) // 59 s into the minute
	res, err := l.Take(ctx, "k")
	require.NoError(t, err)
	require.False(t, res.Allowed)
	require.Equal(t, time.Second, res.RetryAfter)
	require.Equal(t, "1", res.RetryAfterSeconds())
	require.Equal(t, time.Date(2030, 1, 2, 3, 5, 0, 0, time.UTC), res.Reset.UTC())

	c.Add(time.Second) // the next minute
	res, err = l.Take(ctx, "k")
	require.NoError(t, err)
	require.True(t, res.Allowed, "a new window, a new budget")
	res, err = l.Take(ctx, "k")
	require.NoError(t, err)
	require.True(t, res.Allowed)
	res, err = l.Take(ctx, "k")
	require.NoError(t, err)
	require.False(t, res.Allowed)
}

// TestBatchesStayWithinTheLimit: with a limit large enough to be taken in
// batches, many concurrent requests on two replicas are admitted at most
// Limit times, and at least Limit minus what each replica may hold unused.
func TestBatchesStayWithinTheLimit(t *testing.T) {
	url := dbtest.URL(t)
	c := newClock()
	// Not a multiple of the batch: the last grant is a part of one.
	const limit, batch, total = 2010, 20, 2600
	replicas := []*replica{startReplica(t, url, c, limit), startReplica(t, url, c, limit)}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	work := make(chan int)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				resp, err := send(replicas[i%2].srv.URL, "pep")
				if err != nil {
					t.Error(err)
					return
				}
				if resp.StatusCode == http.StatusNoContent {
					admitted.Add(1)
				}
			}
		}()
	}
	for i := range total {
		work <- i
	}
	close(work)
	wg.Wait()
	require.LessOrEqual(t, admitted.Load(), int64(limit), "never more than the limit")
	require.GreaterOrEqual(t, admitted.Load(), int64(limit-2*(batch-1)), "at most batch-1 units stranded per replica")
	var n int
	require.NoError(t, replicas[0].pool.QueryRow(context.Background(), `SELECT n FROM arap.rate_counters WHERE key = 'client:pep'`).Scan(&n))
	require.Equal(t, limit, n)
}

// TestSpentWindowIsRefusedWithoutTheDatabase: once the row says the window
// is spent, the replica refuses the key's requests until the window ends
// without asking again, so a flood past the limit costs no statements.
func TestSpentWindowIsRefusedWithoutTheDatabase(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	p := pool(t, dbtest.URL(t))
	counters := ratelimit.NewCounters(p, table)
	counters.Now = c.Now
	l, err := counters.NewLimiter("s", 1, time.Minute)
	require.NoError(t, err)
	res, err := l.Take(ctx, "k")
	require.NoError(t, err)
	require.True(t, res.Allowed)
	res, err = l.Take(ctx, "k")
	require.NoError(t, err)
	require.False(t, res.Allowed)
	p.Close() // any statement would fail now
	for range 100 {
		res, err = l.Take(ctx, "k")
		require.NoError(t, err)
		require.False(t, res.Allowed)
	}
	c.Add(time.Minute)
	_, err = l.Take(ctx, "k")
	require.Error(t, err, "a new window asks the database again")
}

// TestPurgeDeletesEndedWindows: the purge removes windows that ended and
// keeps the current one.
func TestPurgeDeletesEndedWindows(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	c := newClock()
	counters := ratelimit.NewCounters(db, table)
	counters.Now = c.Now
	l, err := counters.NewLimiter("p", 1, time.Minute)
	require.NoError(t, err)
	_, err = l.Take(ctx, "old")
	require.NoError(t, err)
	c.Add(time.Minute)
	_, err = l.Take(ctx, "new")
	require.NoError(t, err)
	n, err := counters.Purge(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	var keys []string
	rows, err := db.Query(ctx, `SELECT key FROM arap.rate_counters`)
	require.NoError(t, err)
	keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"p:new"}, keys)
	res, err := l.Take(ctx, "new")
	require.NoError(t, err)
	require.False(t, res.Allowed, "the current window's count is kept")
}

// TestDatabaseErrorFailsClosed: a request that cannot be counted is not
// let through.
func TestDatabaseErrorFailsClosed(t *testing.T) {
	p := pool(t, dbtest.URL(t))
	counters := ratelimit.NewCounters(p, table)
	l, err := counters.NewLimiter("f", 100, time.Minute)
	require.NoError(t, err)
	p.Close()
	var failed error
	h := l.Middleware(func(*http.Request) string { return "k" },
		func(http.ResponseWriter, *http.Request) { t.Error("refused instead of failed") },
		func(w http.ResponseWriter, _ *http.Request, err error) {
			failed = err
			w.WriteHeader(http.StatusServiceUnavailable)
		},
	)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("a request that could not be counted got through") }))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Error(t, failed)
}

func TestNewLimiterValidates(t *testing.T) {
	counters := ratelimit.NewCounters(nil, table)
	for _, bad := range []struct {
		name   string
		limit  int
		window time.Duration
	}{{"", 1, time.Minute}, {"x", 0, time.Minute}, {"x", 1, time.Millisecond}} {
		_, err := counters.NewLimiter(bad.name, bad.limit, bad.window)
		require.Error(t, err, "%+v", bad)
	}
}
