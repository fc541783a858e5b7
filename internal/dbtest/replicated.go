package dbtest

import (
	"context"
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
