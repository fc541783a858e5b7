package dbdown_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbdown"
	"github.com/omcp/arap/internal/dbtest"
)

// TestIs classifies errors from a real server going away in each way an
// outage shows, and errors of a healthy server that must not count.
func TestIs(t *testing.T) {
	ctx := context.Background()
	db := dbtest.NewPrivate(t)

	pool, err := pgxpool.New(ctx, db.URL)
	require.NoError(t, err)
	defer pool.Close()

	// A healthy server's refusals are not outages.
	_, err = pool.Exec(ctx, `CREATE TABLE u (k int PRIMARY KEY)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO u VALUES (1)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO u VALUES (1)`)
	require.Error(t, err)
	require.False(t, dbdown.Is(err), "unique violation: %v", err)
	_, err = pool.Exec(ctx, `SELEKT 1`)
	require.False(t, dbdown.Is(err), "syntax error: %v", err)
	err = pool.QueryRow(ctx, `SELECT k FROM u WHERE k = 2`).Scan(new(int))
	require.ErrorIs(t, err, pgx.ErrNoRows)
	require.False(t, dbdown.Is(err))
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = pool.Exec(cctx, `SELECT 1`)
	require.Error(t, err)
	require.False(t, dbdown.Is(err), "cancelled by the caller: %v", err)
	require.False(t, dbdown.Is(nil))
	require.False(t, dbdown.Is(errors.New("something else")))

	// An administrator ends a session (pg_terminate_backend): 57P01.
	victim, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, victim.PgConn().PID())
	require.NoError(t, err)
	_, err = victim.Exec(ctx, `SELECT 1`)
	require.Error(t, err)
	require.True(t, dbdown.Is(err), "terminated session: %T %v", err, err)
	require.False(t, dbdown.NotSent(err), "a statement on a terminated session may have reached the server")

	// A fast stop under an open session and a pooled connection.
	open, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	idle := make([]*pgxpool.Conn, 3) // three idle pooled connections
	for i := range idle {
		idle[i], err = pool.Acquire(ctx)
		require.NoError(t, err)
	}
	for _, c := range idle {
		c.Release()
	}
	db.Stop(t, false)
	_, err = open.Exec(ctx, `SELECT 1`)
	t.Logf("session of a stopped server: %v", err)
	require.True(t, dbdown.Is(err), "session of a stopped server: %T %v", err, err)
	for range idle {
		_, err = pool.Exec(ctx, `SELECT 1`)
		t.Logf("pool of a stopped server: %v", err)
		require.True(t, dbdown.Is(err), "pool of a stopped server: %T %v", err, err)
	}
	// Nothing listens: connection refused.
	_, err = pgx.Connect(ctx, db.URL)
	require.True(t, dbdown.Is(err), "connect to a stopped server: %T %v", err, err)
	require.True(t, dbdown.NotSent(err), "no connection: nothing was sent")
	_, err = pool.Exec(ctx, `INSERT INTO u VALUES (3)`)
	require.True(t, dbdown.Is(err) && dbdown.NotSent(err), "a pool that cannot connect sent nothing: %T %v", err, err)
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = pool.Acquire(tctx)
	require.True(t, dbdown.Is(err), "acquire while stopped: %T %v", err, err)

	// Back up: the same pool works again; then a crash (immediate stop)
	// under an open session.
	db.Start(t)
	_, err = pool.Exec(ctx, `SELECT 1`)
	require.NoError(t, err)
	open, err = pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	db.Stop(t, true)
	_, err = open.Exec(ctx, `SELECT 1`)
	require.True(t, dbdown.Is(err), "session of a crashed server: %T %v", err, err)
	_, err = pool.Exec(ctx, `SELECT 1`)
	require.True(t, dbdown.Is(err), "pool of a crashed server: %T %v", err, err)
}
