package seal_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/seal"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

var (
	oldKey = bytes.Repeat([]byte{1}, 32)
	newKey = bytes.Repeat([]byte{2}, 32)
	col    = seal.Column{Schema: "public", Table: "secrets", Key: "id", Value: "v", AD: "id"}
)

// secrets makes a table of n values sealed under box (AD = the row id).
func secrets(t *testing.T, db *pgxpool.Pool, box *seal.Box, n int) {
	t.Helper()
	_, err := db.Exec(context.Background(), `CREATE TABLE public.secrets (id text PRIMARY KEY, v bytea NOT NULL)`)
	require.NoError(t, err)
	for i := range n {
		id := fmt.Sprintf("row-%04d", i)
		_, err := db.Exec(context.Background(), `INSERT INTO public.secrets VALUES ($1, $2)`, id, box.Seal([]byte("secret "+id), id))
		require.NoError(t, err)
	}
}

// raceDB writes a row itself (as the running service would) between the
// re-seal's read and its UPDATE of that row.
type raceDB struct {
	*pgxpool.Pool
	write func()
}

func (r *raceDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if r.write != nil {
		r.write()
		r.write = nil
	}
	return r.Pool.Exec(ctx, sql, args...)
}

func TestResealAndCheck(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	old, _ := seal.New(oldKey)
	rotated, _ := seal.New(newKey, oldKey)
	onlyNew, _ := seal.New(newKey)
	// More rows than one batch, so the walk pages.
	secrets(t, db, old, 450)

	counts, err := seal.Check(ctx, db, onlyNew, []seal.Column{col})
	require.NoError(t, err)
	require.Equal(t, 450, counts[0].Stale, "before the re-seal every value is under the old key")

	// The service writes row-0000 (under the new key, as it runs with
	// current = new) after the re-seal read it: the conditional UPDATE
	// must not overwrite it.
	written := rotated.Seal([]byte("written by the service"), "row-0000")
	race := &raceDB{Pool: db, write: func() {
		_, err := db.Exec(ctx, `UPDATE public.secrets SET v = $1 WHERE id = 'row-0000'`, written)
		require.NoError(t, err)
	}}
	counts, err = seal.Reseal(ctx, race, rotated, []seal.Column{col})
	require.NoError(t, err)
	require.Equal(t, seal.Count{Column: col, Rows: 450, Resealed: 449, Current: 1}, counts[0])
	var v []byte
	require.NoError(t, db.QueryRow(ctx, `SELECT v FROM public.secrets WHERE id = 'row-0000'`).Scan(&v))
	require.Equal(t, written, v, "the service's concurrent write was kept")

	counts, err = seal.Check(ctx, db, onlyNew, []seal.Column{col})
	require.NoError(t, err)
	require.Equal(t, seal.Count{Column: col, Rows: 450, Current: 450}, counts[0])
	rows, err := db.Query(ctx, `SELECT id, v FROM public.secrets`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id, &v))
		_, err := onlyNew.Open(v, id)
		require.NoError(t, err, "%s opens under the new key alone", id)
	}
	require.NoError(t, rows.Err())

	// Run again: nothing left to do.
	counts, err = seal.Reseal(ctx, db, rotated, []seal.Column{col})
	require.NoError(t, err)
	require.Equal(t, seal.Count{Column: col, Rows: 450, Current: 450}, counts[0])

	// A value put back under the old key is found.
	_, err = db.Exec(ctx, `UPDATE public.secrets SET v = $1 WHERE id = 'row-0007'`, old.Seal([]byte("x"), "row-0007"))
	require.NoError(t, err)
	counts, err = seal.Check(ctx, db, onlyNew, []seal.Column{col})
	require.NoError(t, err)
	require.Equal(t, 1, counts[0].Stale)

	// A value no key opens is counted, left alone, and the rest goes on.
	_, err = db.Exec(ctx, `UPDATE public.secrets SET v = $1 WHERE id = 'row-0008'`, []byte("garbage that no key opens at all"))
	require.NoError(t, err)
	counts, err = seal.Reseal(ctx, db, rotated, []seal.Column{col})
	require.NoError(t, err)
	require.Equal(t, seal.Count{Column: col, Rows: 450, Resealed: 1, Current: 448, Stale: 1}, counts[0])
}

// TestNullValuesHoldNothing: a NULL value (an ended intent's dropped
// submission body) has nothing sealed in it, so neither the re-seal nor the
// check counts it; counted, it would be a stale value no key opens, and
// `keys reseal --check` would never let a previous key go.
func TestNullValuesHoldNothing(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	old, _ := seal.New(oldKey)
	rotated, _ := seal.New(newKey, oldKey)
	onlyNew, _ := seal.New(newKey)
	secrets(t, db, old, 3)
	_, err := db.Exec(ctx, `ALTER TABLE public.secrets ALTER COLUMN v DROP NOT NULL`)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `UPDATE public.secrets SET v = NULL WHERE id = 'row-0001'`)
	require.NoError(t, err)

	counts, err := seal.Reseal(ctx, db, rotated, []seal.Column{col})
	require.NoError(t, err)
	require.Equal(t, seal.Count{Column: col, Rows: 2, Resealed: 2}, counts[0])
	counts, err = seal.Check(ctx, db, onlyNew, []seal.Column{col})
	require.NoError(t, err)
	require.Equal(t, seal.Count{Column: col, Rows: 2, Current: 2}, counts[0])
}

// A value dropped between the re-seal's read and its UPDATE (an intent
// ending meanwhile) is no longer a row to count, not a stale one.
func TestValueDroppedDuringReseal(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	old, _ := seal.New(oldKey)
	rotated, _ := seal.New(newKey, oldKey)
	secrets(t, db, old, 1)
	_, err := db.Exec(ctx, `ALTER TABLE public.secrets ALTER COLUMN v DROP NOT NULL`)
	require.NoError(t, err)
	race := &raceDB{Pool: db, write: func() {
		_, err := db.Exec(ctx, `UPDATE public.secrets SET v = NULL WHERE id = 'row-0000'`)
		require.NoError(t, err)
	}}
	counts, err := seal.Reseal(ctx, race, rotated, []seal.Column{col})
	require.NoError(t, err)
	require.Equal(t, seal.Count{Column: col}, counts[0])
}
