package pep

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/omcp/arap/internal/pglisten"
)

// The memory of authenticated callers (Callers), and the listener that
// keeps it honest: an allowed tool call through the gateway then costs no
// PostgreSQL round trip to authenticate its caller.
//
// Why a revoked token is never served from memory once the revocation has
// reached this replica:
//   - Revoke sends a notification on CallersChannel in the transaction that
//     revokes, so it is delivered when, and only if, the revocation commits.
//   - The cache holds principals only while the listening connection is up
//     (live). It starts empty when LISTEN has taken effect, so a revocation
//     announced while nobody listened cannot be missed, and it empties and
//     stops remembering as soon as the connection is found lost.
//   - Every notification empties it and advances its generation. A lookup
//     reads the generation before it reads the table, and its answer is
//     kept only if the generation has not moved: an answer read before a
//     revocation committed but returned after the notification was heard is
//     not kept. One returned before the notification is heard is emptied by
//     it.
//
// The lag is then PostgreSQL's delivery of a notification to an idle
// connection. A connection lost without a word (no RST) is found by a ping
// after pglisten.PingEvery of silence. Entries also expire after
// callerCacheTTL whatever is heard, which bounds a revocation written by
// hand in SQL without the notification.

const (
	// callerCacheTTL bounds how long a principal is remembered at all.
	callerCacheTTL = time.Minute
	// callerCacheMax bounds the tokens remembered; past it the memory is
	// emptied and refills from the busiest callers.
	callerCacheMax = 10000
)

type callerCache struct {
	now  func() time.Time
	mu   sync.Mutex
	live bool   // the listener is connected and LISTENing
	gen  uint64 // advanced whenever the memory is emptied
	// listens counts the times live was set (tests wait for a reconnect).
	listens int
	m       map[[32]byte]cachedCaller
}

type cachedCaller struct {
	p     Principal
	until time.Time
}

func newCallerCache(now func() time.Time) *callerCache {
	return &callerCache{now: now, m: map[[32]byte]cachedCaller{}}
}

// get returns the remembered principal of token hash h, or the generation
// a lookup of h in the table must hand put.
func (c *callerCache) get(h [32]byte) (Principal, uint64, bool) {
	if c == nil {
		return Principal{}, 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[h]
	if ok && c.live && c.now().Before(e.until) {
		return e.p, c.gen, true
	}
	return Principal{}, c.gen, false
}

// put remembers p for h, if the listener is live and nothing was forgotten
// since get returned gen.
func (c *callerCache) put(h [32]byte, p Principal, gen uint64) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.live || gen != c.gen {
		return
	}
	if len(c.m) >= callerCacheMax {
		clear(c.m)
	}
	c.m[h] = cachedCaller{p: p, until: c.now().Add(callerCacheTTL)}
}

// forget empties the memory.
func (c *callerCache) forget() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgetLocked()
}

func (c *callerCache) forgetLocked() {
	clear(c.m)
	c.gen++
}

// setLive empties the memory and says whether it may fill again.
func (c *callerCache) setLive(live bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgetLocked()
	c.live = live
	if live {
		c.listens++
	}
}

// Listen keeps the memory of authenticated callers while it hears
// CallersChannel, until ctx ends; it reconnects after a loss, and while it
// is not listening nothing is remembered. Without Listen running the
// Callers read the table on every Authenticate. The gate runs it (Start).
func (c *Callers) Listen(ctx context.Context, log *slog.Logger) {
	if c.cache == nil {
		return
	}
	l := pglisten.Listener{DB: c.DB, Channel: CallersChannel, Name: CallersListener,
		What: "caller revocations (authenticating from the database meanwhile)", Log: log,
		Live: c.cache.setLive, Heard: func(string) { c.cache.forget() }}
	l.Run(ctx, nil)
}

// CallersListener is the application_name of the listening connection.
const CallersListener = "arap-callers-listener"
