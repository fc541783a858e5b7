package seal

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Column is one sealed column, as the package that owns its table describes
// it: where the values are, the row's key, and which column holds the
// additional data each value was sealed for. Key and AD are text columns.
type Column struct {
	Schema, Table string
	Key           string // primary key
	Value         string // the sealed bytea
	AD            string // the additional data (often the key itself)
}

func (c Column) String() string { return c.Schema + "." + c.Table + "." + c.Value }

// DB is what Reseal and Check need of a pool: each statement runs in its own
// transaction.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Count is what Reseal or Check found in one column.
type Count struct {
	Column   Column
	Rows     int // rows read
	Resealed int // re-sealed under the current key
	Current  int // already under the current key
	// Stale counts values not under the current key: for Reseal, values
	// none of the Box's keys opens (left as they are); for Check, every
	// value the current key does not open in the current format.
	Stale int
}

// batch is how many rows are read at a time.
const batch = 200

// Reseal moves every value of cols to the Box's current key, row by row: each
// row is one conditional UPDATE (its own transaction) that applies only if
// the value is still the one read, so a value the running service writes
// meanwhile is never overwritten; such a row is read again. Values already
// under the current key are left alone, so Reseal can be run again.
func Reseal(ctx context.Context, db DB, b *Box, cols []Column) ([]Count, error) {
	var out []Count
	for _, c := range cols {
		n := Count{Column: c}
		err := walk(ctx, db, c, func(k, ad string, v []byte) error {
			n.Rows++
			for range 10 {
				nv, changed, err := b.Reseal(v, ad)
				if errors.Is(err, ErrOpen) {
					n.Stale++
					return nil
				}
				if !changed {
					n.Current++
					return nil
				}
				tag, err := db.Exec(ctx, fmt.Sprintf(`UPDATE %s SET %s = $1 WHERE %s = $2 AND %s = $3`,
					c.table(), ident(c.Value), ident(c.Key), ident(c.Value)), nv, k, v)
				if err != nil {
					return err
				}
				if tag.RowsAffected() == 1 {
					n.Resealed++
					return nil
				}
				// Written (or removed) since it was read: read it again.
				err = db.QueryRow(ctx, fmt.Sprintf(`SELECT %s, %s FROM %s WHERE %s = $1`,
					ident(c.AD), ident(c.Value), c.table(), ident(c.Key)), k).Scan(&ad, &v)
				if errors.Is(err, pgx.ErrNoRows) {
					n.Rows--
					return nil
				}
				if err != nil {
					return err
				}
				if v == nil { // its value dropped meanwhile: nothing sealed left
					n.Rows--
					return nil
				}
			}
			return fmt.Errorf("%s: a row keeps changing under the re-seal", c)
		})
		if err != nil {
			return out, fmt.Errorf("seal: reseal %s: %w", c, err)
		}
		out = append(out, n)
	}
	return out, nil
}

// Check counts, per column, the values that are not under the Box's current
// key (Stale): before a previous key is retired, every count must be zero.
func Check(ctx context.Context, db DB, b *Box, cols []Column) ([]Count, error) {
	var out []Count
	for _, c := range cols {
		n := Count{Column: c}
		err := walk(ctx, db, c, func(_, ad string, v []byte) error {
			n.Rows++
			if b.Current(v, ad) {
				n.Current++
			} else {
				n.Stale++
			}
			return nil
		})
		if err != nil {
			return out, fmt.Errorf("seal: check %s: %w", c, err)
		}
		out = append(out, n)
	}
	return out, nil
}

// walk calls fn with every row of c, in key order, a batch at a time (no
// long-running transaction).
func walk(ctx context.Context, db DB, c Column, fn func(key, ad string, v []byte) error) error {
	type row struct {
		k, ad string
		v     []byte
	}
	// A NULL value holds nothing sealed (an ended intent's dropped body).
	q := fmt.Sprintf(`SELECT %s, %s, %s FROM %s WHERE %s > $1 AND %s IS NOT NULL ORDER BY %s LIMIT %d`,
		ident(c.Key), ident(c.AD), ident(c.Value), c.table(), ident(c.Key), ident(c.Value), ident(c.Key), batch)
	last := ""
	for {
		rows, err := db.Query(ctx, q, last)
		if err != nil {
			return err
		}
		got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
			var x row
			return x, r.Scan(&x.k, &x.ad, &x.v)
		})
		if err != nil {
			return err
		}
		for _, r := range got {
			if err := fn(r.k, r.ad, r.v); err != nil {
				return err
			}
		}
		if len(got) < batch {
			return nil
		}
		last = got[len(got)-1].k
	}
}

func (c Column) table() string { return pgx.Identifier{c.Schema, c.Table}.Sanitize() }

func ident(s string) string { return pgx.Identifier{s}.Sanitize() }
