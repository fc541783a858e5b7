// Package pglisten holds a PostgreSQL LISTEN on a connection of its own
// (outside the pool, which would hand a listening connection to others):
// it reconnects after a loss and pings after a silence, so that a
// connection dead without a word (a half-open TCP connection, a
// terminated backend) is found and replaced. Its users keep caches that a
// notification empties, and treat the time without a listening
// connection as time in which anything may have changed.
package pglisten

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PingEvery is how long a listener waits in silence before it checks its
// connection.
const PingEvery = 5 * time.Second

// Backoff after a failed connection starts here and doubles to maxBackoff.
const (
	minBackoff = 250 * time.Millisecond
	maxBackoff = 30 * time.Second
)

// Listener is one channel's listener.
type Listener struct {
	DB      *pgxpool.Pool
	Channel string
	// Name is the connection's application_name (seen in pg_stat_activity).
	Name string
	// What names the listener in its warnings ("caller revocations").
	What string
	Log  *slog.Logger // nil: no warnings
	// Live is called with true once LISTEN holds (whatever changed before
	// is to be read again) and with false when the connection is lost.
	Live func(live bool)
	// Heard is called with each notification's payload.
	Heard func(payload string)
}

// direct holds, by pool, the connection configuration its listeners use
// instead of the pool's own (Direct).
var direct sync.Map // *pgxpool.Pool -> *pgx.ConnConfig

// Direct makes every Listener on pool connect with cfg instead of with
// pool's configuration: when pool goes through a transaction-mode
// connection pooler (PgBouncer), which hands each transaction a server
// connection of its choosing, a LISTEN must hold a PostgreSQL session of
// its own, so cfg connects to PostgreSQL directly. The process that opened
// pool calls Direct before its listeners start, and Forget when it closes
// pool.
func Direct(pool *pgxpool.Pool, cfg *pgx.ConnConfig) { direct.Store(pool, cfg) }

// Forget undoes Direct.
func Forget(pool *pgxpool.Pool) { direct.Delete(pool) }

// config is the configuration l's connections are made with.
func (l *Listener) config() *pgx.ConnConfig {
	if cfg, ok := direct.Load(l.DB); ok {
		return cfg.(*pgx.ConnConfig).Copy()
	}
	return l.DB.Config().ConnConfig.Copy()
}

// Dial opens a connection of its own (to PostgreSQL itself when the pool
// goes through a pooler: Direct) and LISTENs on the channel.
func (l *Listener) Dial(ctx context.Context) (*pgx.Conn, error) {
	cc := l.config()
	cc.RuntimeParams["application_name"] = l.Name
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.Channel}.Sanitize()); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return conn, nil
}

// Run listens until ctx ends, on conn if it is not nil (a connection Dial
// made, for a caller that must fail when the first one cannot be made),
// and on connections of its own after that.
func (l *Listener) Run(ctx context.Context, conn *pgx.Conn) {
	backoff := minBackoff
	wait := func() {
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
	for ctx.Err() == nil {
		if conn == nil {
			var err error
			if conn, err = l.Dial(ctx); err != nil {
				if ctx.Err() == nil {
					l.warn("cannot listen; retrying", err)
				}
				wait()
				continue
			}
		}
		l.live(true)
		since := time.Now()
		err := l.hear(ctx, conn)
		l.live(false)
		_ = conn.Close(context.WithoutCancel(ctx))
		conn = nil
		if ctx.Err() != nil {
			break
		}
		l.warn("listening connection lost; reconnecting", err)
		// A connection dropped as soon as it is made (a proxy, a backend
		// killed over and over) backs off as a failed one does: each new
		// one makes every user re-read what it keeps.
		if time.Since(since) >= PingEvery {
			backoff = minBackoff
		}
		wait()
	}
	if conn != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
	}
}

// hear passes on every notification, and pings the connection after
// PingEvery of silence, until the connection fails or ctx ends.
func (l *Listener) hear(ctx context.Context, conn *pgx.Conn) error {
	for {
		wait, cancel := context.WithTimeout(ctx, PingEvery)
		n, err := conn.WaitForNotification(wait)
		cancel()
		switch {
		case err == nil:
			if l.Heard != nil {
				l.Heard(n.Payload)
			}
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, context.DeadlineExceeded):
			// Silence: a timed-out wait leaves the connection usable.
			ping, cancel := context.WithTimeout(ctx, PingEvery)
			err := conn.Ping(ping)
			cancel()
			if err != nil {
				return err
			}
		default:
			return err
		}
	}
}

func (l *Listener) live(live bool) {
	if l.Live != nil {
		l.Live(live)
	}
}

func (l *Listener) warn(msg string, err error) {
	if l.Log != nil {
		l.Log.Warn(l.What+": "+msg, "error", err)
	}
}
