package pep

import (
	"context"
	"log/slog"
	"time"

	"github.com/omcp/arap/internal/pglisten"
)

// The memory of authenticated callers (Callers), and the listener that
// keeps it honest (memory.go says how): an allowed tool call through the
// gateway then costs no PostgreSQL round trip to authenticate its caller.
//
// Why a revoked token is never served from memory once the revocation has
// reached this replica: Revoke sends a notification on CallersChannel in
// the transaction that revokes, so it is delivered when, and only if, the
// revocation commits; the memory holds principals only while the listening
// connection is up; every notification empties it, and a lookup that read
// the table before the revocation but returns after it was heard is not
// kept.
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

// callerCache remembers principals by token hash.
type callerCache = memory[Principal]

func newCallerCache(now func() time.Time) *callerCache {
	return newMemory[Principal](now, callerCacheMax)
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
		Live: func(live bool) { c.cache.setLive(live, 0) }, Heard: func(string) { c.heard() }}
	l.Run(ctx, nil)
}

// CallersListener is the application_name of the listening connection.
const CallersListener = "arap-callers-listener"
