package dbtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/omcp/arap/internal/pgembed"
)

// Replicated is a private primary, with one migrated database "arap" like
// Private's, and streaming standbys of it, for tests of what the processes
// do on a read-only server and across a failover.
type Replicated struct {
	// Primary and its URL of the migrated database (TCP on 127.0.0.1).
	Primary *pgembed.Cluster
	URL     string
}

// NewReplicated starts a private primary (durable: not Ephemeral, so that a
// synchronous standby is waited for) with a migrated database; both it and
// the standbys are stopped when the test ends.
func NewReplicated(tb testing.TB) *Replicated {
	tb.Helper()
	p := NewPrivate(tb)
	return &Replicated{Primary: p.c, URL: p.URL}
}

// Standby starts a streaming standby of the primary (pgembed
// Cluster.StartStandby with opts; a port of its own on 127.0.0.1 unless
// opts.Port says otherwise) and returns it with the URL of its copy of the
// migrated database: read-only, writes refused with 25006. It holds what
// the primary held when it was made, and follows.
func (r *Replicated) Standby(tb testing.TB, opts pgembed.StandbyOptions) (*pgembed.Cluster, string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if opts.Port == 0 {
		opts.Port = -1
	}
	s, err := r.Primary.StartStandby(ctx, opts)
	if err != nil {
		tb.Fatalf("dbtest: standby: %v", err)
	}
	tb.Cleanup(func() { _ = s.Stop(context.Background()) })
	return s, s.ConnString("arap")
}

// Exec runs sql on the primary's postgres database as the superuser
// (ALTER SYSTEM and the like).
func (r *Replicated) Exec(tb testing.TB, sql string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, r.Primary.ConnString("postgres"))
	if err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		tb.Fatalf("dbtest: %s: %v", sql, err)
	}
}

// Addr is c's TCP address (a cluster started with a Port).
func Addr(c *pgembed.Cluster) string { return fmt.Sprintf("127.0.0.1:%d", c.Port()) }

// WaitReplayed waits until standby has replayed everything the primary
// has written so far.
func (r *Replicated) WaitReplayed(tb testing.TB, standby *pgembed.Cluster) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var lsn string
	p, err := pgx.Connect(ctx, r.Primary.ConnString("postgres"))
	if err == nil {
		err = p.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn)
		_ = p.Close(ctx)
	}
	if err != nil {
		tb.Fatalf("dbtest: primary's WAL position: %v", err)
	}
	s, err := pgx.Connect(ctx, standby.ConnString("postgres"))
	if err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	defer s.Close(ctx)
	for {
		var done bool
		if err := s.QueryRow(ctx, "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn).Scan(&done); err != nil {
			tb.Fatalf("dbtest: standby's replay: %v", err)
		}
		if done {
			return
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("dbtest: the standby has not replayed %s within a minute", lsn)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
