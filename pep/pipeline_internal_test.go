package pep

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
)

// TestInTx: the pipelined transaction commits what then allows, with what
// it queued, and nothing that then refuses or a failing statement aborts,
// in either pipeline; its connection goes back to the pool out of any
// transaction.
func TestInTx(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dbtest.URL(t))
	require.NoError(t, err)
	cfg.MaxConns = 1
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	_, err = db.Exec(ctx, `CREATE TABLE pipelined (n int PRIMARY KEY)`)
	require.NoError(t, err)
	rows := func() int {
		var n int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM pipelined`).Scan(&n))
		return n
	}
	insert := func(ns ...int) (*pgx.Batch, *int) {
		b := &pgx.Batch{}
		var seen int
		for _, n := range ns {
			b.Queue(`INSERT INTO pipelined VALUES ($1)`, n)
		}
		b.Queue(`SELECT count(*) FROM pipelined`).QueryRow(func(r pgx.Row) error { return r.Scan(&seen) })
		return b, &seen
	}
	conns := db.Stat().NewConnsCount()
	keepIf := func(cond func() bool, then ...int) func(*pgx.Batch) (bool, error) {
		return func(next *pgx.Batch) (bool, error) {
			for _, n := range then {
				next.Queue(`INSERT INTO pipelined VALUES ($1)`, n)
			}
			return cond(), nil
		}
	}

	b, seen := insert(1, 2)
	ok, err := inTx(ctx, db, b, keepIf(func() bool { return *seen < 2 }, 3))
	require.NoError(t, err)
	require.False(t, ok)
	require.Zero(t, rows(), "keep saw its writes and refused them: rolled back, and what it queued never sent")

	b, _ = insert(1, 1)
	ok, err = inTx(ctx, db, b, nil)
	require.ErrorContains(t, err, "23505")
	require.False(t, ok)
	require.Zero(t, rows(), "a failing statement rolls back the ones before it")

	b, seen = insert(1, 2)
	ok, err = inTx(ctx, db, b, keepIf(func() bool { return *seen == 2 }, 3, 1))
	require.ErrorContains(t, err, "23505")
	require.False(t, ok)
	require.Zero(t, rows(), "a failing statement sent with the COMMIT rolls back the whole")

	b, seen = insert(1, 2)
	ok, err = inTx(ctx, db, b, keepIf(func() bool { return *seen == 2 }, 3))
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 3, rows(), "committed with what then queued")
	require.Equal(t, conns, db.Stat().NewConnsCount(), "one connection served every transaction: none was left in one")
}
