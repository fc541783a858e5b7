// Package ratelimit enforces request budgets that hold across every replica
// sharing one PostgreSQL database, and across their restarts: a Limiter
// admits at most Limit requests per key in each fixed window of length
// Window, counting in a table row per key and window.
//
// Units are taken from the row with one statement, an INSERT ... ON CONFLICT
// DO UPDATE that adds to the count only up to the limit. PostgreSQL's row
// lock serializes concurrent takes of one key, whichever replica they come
// from, so the units handed out per key and window never exceed the limit:
// N replicas together admit Limit, not N×Limit.
//
// A replica takes units in batches of 1% of the limit (1 below a limit of
// 200, at most 100) and hands them out from memory, and once the row says
// the window is spent it refuses locally until the window ends. So a busy
// key costs one statement per batch rather than per request, and a flood
// past the limit costs the database nothing. The price of batching is on the
// low side only: units a replica took but did not use by the window's end
// (or when it stopped) are lost, at most replicas × (batch − 1) per key and
// window. Limits below 200 are counted request by request, exactly.
//
// Fixed windows rather than a sliding estimate: one row and one statement
// decide, and a refusal writes nothing. The price is the boundary: a caller
// can spend one window's budget at its end and the next one's at its start,
// up to 2×Limit in a short span. For abuse budgets counted per minute that
// is acceptable; a burst-sensitive budget should use a shorter window.
//
// The window is taken from the replica's clock (Counters.Now), so replicas
// are expected to keep time (NTP); skew only blurs a window's edge.
//
// On a database error Take returns the error, and callers refuse the request
// (fail closed): the limits protect the database, and a request that cannot
// be counted would mostly fail on the same database anyway.
//
// The package is a leaf: it knows nothing of the tables' owners, only the
// table name each process gives it (arap.rate_counters for the backend and
// the web UI, pep.rate_counters for the MCP front-end).
package ratelimit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what the counters need of a pool.
type DB interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Counters is one table of counters, with columns (key text, window_end
// timestamptz, n integer) and primary key (key, window_end). Several
// Limiters share a table; their Names keep their keys apart.
type Counters struct {
	db    DB
	table string
	take  string
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// NewCounters uses table (schema and name) in db.
func NewCounters(db DB, table pgx.Identifier) *Counters {
	t := table.Sanitize()
	return &Counters{db: db, table: t,
		// Takes up to $3 units of the $4 the window allows. No row back
		// means the row is at the limit: nothing granted, nothing written.
		// granted is this statement's grant (the row is locked until the
		// statement ends, so it is ours).
		take: `INSERT INTO ` + t + ` AS c (key, window_end, n, granted) VALUES ($1, $2, least($3::int, $4::int), least($3::int, $4::int))
			ON CONFLICT (key, window_end) DO UPDATE SET n = c.n + least($3::int, $4::int - c.n), granted = least($3::int, $4::int - c.n)
			WHERE c.n < $4::int
			RETURNING c.granted`,
	}
}

func (c *Counters) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// Purge deletes the counters of windows that have ended.
func (c *Counters) Purge(ctx context.Context) (int64, error) {
	tag, err := c.db.Exec(ctx, `DELETE FROM `+c.table+` WHERE window_end < $1`, c.now())
	if err != nil {
		return 0, fmt.Errorf("ratelimit: purge %s: %w", c.table, err)
	}
	return tag.RowsAffected(), nil
}

// Limiter is one budget: Limit requests per key per Window.
type Limiter struct {
	counters *Counters
	name     string
	limit    int
	batch    int
	window   time.Duration

	mu   sync.Mutex
	keys map[string]*share
}

// share is this replica's part of one key's window: units taken from the
// row and not yet handed out, or the knowledge that the row is spent.
type share struct {
	mu    sync.Mutex
	end   time.Time
	left  int
	spent bool
}

// maxShares bounds the keys a limiter remembers; past it, a key's requests
// are counted one by one in the database (exact, slower).
const maxShares = 10000

// NewLimiter returns the budget name (which namespaces its keys in the
// table) of limit requests per key per window.
func (c *Counters) NewLimiter(name string, limit int, window time.Duration) (*Limiter, error) {
	if name == "" || limit < 1 || limit > math.MaxInt32 || window < time.Second {
		return nil, fmt.Errorf("ratelimit: limiter %q needs a name, a limit of 1 to %d and a window of at least a second", name, math.MaxInt32)
	}
	return &Limiter{counters: c, name: name, limit: limit, batch: min(100, max(1, limit/100)), window: window,
		keys: map[string]*share{}}, nil
}

// Result is the outcome of one Take.
type Result struct {
	Allowed bool
	// Reset is the end of the window; RetryAfter the time left until then.
	Reset      time.Time
	RetryAfter time.Duration
}

// RetryAfterSeconds is RetryAfter for a Retry-After header: whole seconds,
// rounded up, at least 1.
func (r Result) RetryAfterSeconds() string {
	return strconv.Itoa(max(1, int(math.Ceil(r.RetryAfter.Seconds()))))
}

// maxKey bounds a key as stored; longer ones are stored as a hash.
const maxKey = 128

// Take counts one request of key and reports whether it is within the
// budget. A refused request is not counted.
func (l *Limiter) Take(ctx context.Context, key string) (Result, error) {
	now := l.counters.now()
	end := now.Truncate(l.window).Add(l.window)
	res := Result{Reset: end, RetryAfter: end.Sub(now)}
	k := l.name + ":" + key
	if len(k) > maxKey {
		sum := sha256.Sum256([]byte(key))
		k = l.name + ":sha256:" + hex.EncodeToString(sum[:])
	}
	sh := l.share(k, end)
	if sh == nil {
		granted, err := l.take(ctx, k, end, 1)
		res.Allowed = granted == 1
		return res, err
	}
	// Held across the statement: the key's other requests on this replica
	// wait for the batch instead of each taking one.
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if !sh.end.Equal(end) {
		sh.end, sh.left, sh.spent = end, 0, false
	}
	switch {
	case sh.left > 0:
		sh.left--
		res.Allowed = true
		return res, nil
	case sh.spent:
		return res, nil
	}
	granted, err := l.take(ctx, k, end, l.batch)
	if err != nil {
		return Result{}, err
	}
	if granted == 0 {
		sh.spent = true // counts only grow within a window
		return res, nil
	}
	sh.left = granted - 1
	res.Allowed = true
	return res, nil
}

// take asks the row for up to want units and returns how many it granted.
func (l *Limiter) take(ctx context.Context, key string, end time.Time, want int) (int, error) {
	var granted int
	err := l.counters.db.QueryRow(ctx, l.counters.take, key, end, want, l.limit).Scan(&granted)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("ratelimit: take %s: %w", l.name, err)
	}
	return granted, nil
}

// share returns key's share, or nil when too many keys are remembered.
func (l *Limiter) share(key string, end time.Time) *share {
	l.mu.Lock()
	defer l.mu.Unlock()
	if sh, ok := l.keys[key]; ok {
		return sh
	}
	if len(l.keys) >= maxShares {
		for k, sh := range l.keys {
			// A busy share is in use; ended windows are forgotten (their
			// unused units are lost either way).
			if sh.mu.TryLock() {
				if sh.end.Before(end) {
					delete(l.keys, k)
				}
				sh.mu.Unlock()
			}
		}
		if len(l.keys) >= maxShares {
			return nil
		}
	}
	sh := &share{}
	l.keys[key] = sh
	return sh
}

// Middleware limits requests by key(r). A refused request gets a
// Retry-After header and then refuse; a request that could not be counted
// goes to fail (fail closed).
func (l *Limiter) Middleware(key func(*http.Request) string, refuse http.HandlerFunc, fail func(http.ResponseWriter, *http.Request, error)) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !l.Serve(w, r, key(r), refuse, fail) {
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// Serve takes a unit for key and reports whether the request may go on;
// when it may not, the response has been written (refuse or fail, as in
// Middleware).
func (l *Limiter) Serve(w http.ResponseWriter, r *http.Request, key string, refuse http.HandlerFunc, fail func(http.ResponseWriter, *http.Request, error)) bool {
	res, err := l.Take(r.Context(), key)
	if err != nil {
		fail(w, r, err)
		return false
	}
	if !res.Allowed {
		w.Header().Set("Retry-After", res.RetryAfterSeconds())
		refuse(w, r)
		return false
	}
	return true
}
