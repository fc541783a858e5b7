// Package ratelimit enforces request budgets that hold across every replica
// sharing one PostgreSQL database, and across their restarts: a Limiter
// admits at most Limit requests per key in each fixed window of length
// Window. Taking a unit is one statement, an INSERT ... ON CONFLICT DO UPDATE
// on the key's row for the current window that increments the count only
// while it is below the limit. PostgreSQL's row lock serializes concurrent
// takes of one key, whichever replica they come from, so the admitted count
// per key and window is exact: N replicas together admit Limit, not N×Limit.
//
// Fixed windows rather than a sliding estimate: one row and one statement
// decide exactly, and a refusal writes nothing (the conditional update
// leaves the row alone), so a flood costs no more writes than the budget.
// The price is the boundary: a caller can spend one window's budget at its
// end and the next one's at its start, up to 2×Limit in a short span. For
// abuse budgets counted per minute that is acceptable; a burst-sensitive
// budget should use a shorter window.
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
	"net"
	"net/http"
	"net/netip"
	"strconv"
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
		// No row back means the row exists at the limit: refused, and
		// nothing written.
		take: `INSERT INTO ` + t + ` AS c (key, window_end, n) VALUES ($1, $2, 1)
			ON CONFLICT (key, window_end) DO UPDATE SET n = c.n + 1 WHERE c.n < $3
			RETURNING c.n`,
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
	window   time.Duration
}

// NewLimiter returns the budget name (which namespaces its keys in the
// table) of limit requests per key per window.
func (c *Counters) NewLimiter(name string, limit int, window time.Duration) (*Limiter, error) {
	if name == "" || limit < 1 || limit > math.MaxInt32 || window < time.Second {
		return nil, fmt.Errorf("ratelimit: limiter %q needs a name, a limit of 1 to %d and a window of at least a second", name, math.MaxInt32)
	}
	return &Limiter{counters: c, name: name, limit: limit, window: window}, nil
}

// Result is the outcome of one Take.
type Result struct {
	Allowed bool
	// Count is the key's admitted requests in this window, this one
	// included; Limit when refused.
	Count, Limit int
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
	res := Result{Limit: l.limit, Reset: end, RetryAfter: end.Sub(now)}
	k := l.name + ":" + key
	if len(k) > maxKey {
		sum := sha256.Sum256([]byte(key))
		k = l.name + ":sha256:" + hex.EncodeToString(sum[:])
	}
	err := l.counters.db.QueryRow(ctx, l.counters.take, k, end, l.limit).Scan(&res.Count)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		res.Count = l.limit
		return res, nil
	case err != nil:
		return Result{}, fmt.Errorf("ratelimit: take %s: %w", l.name, err)
	}
	res.Allowed = true
	return res, nil
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

// ClientIP is the key of a request's remote address: the IPv4 address, or
// the /64 prefix of an IPv6 one (one host usually holds a whole /64). It is
// the peer of the connection: behind a reverse proxy that is the proxy.
func ClientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}
