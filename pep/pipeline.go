package pep

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// inTx runs b's statements in one transaction whose BEGIN is sent with
// them, as one pipeline (one round trip); then, once b's results have been
// read, then (nil: nothing) says whether to commit or to roll back, and
// queues on its batch what must follow, which is sent with the COMMIT as a
// second pipeline. It reports whether the transaction was committed: two
// round trips, for what pgx.BeginFunc does in at least four. A statement
// that fails rolls the transaction back and is the error.
func inTx(ctx context.Context, db *pgxpool.Pool, b *pgx.Batch, then func(next *pgx.Batch) (bool, error)) (bool, error) {
	c, err := db.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer c.Release() // a connection left in a transaction is closed, not reused
	full := &pgx.Batch{}
	full.Queue("BEGIN")
	full.QueuedQueries = append(full.QueuedQueries, b.QueuedQueries...)
	err = c.SendBatch(ctx, full).Close()
	keep, next := err == nil, &pgx.Batch{}
	if keep && then != nil {
		keep, err = then(next)
	}
	if keep && err == nil {
		committed := false
		next.Queue("COMMIT").Exec(func(tag pgconn.CommandTag) error {
			committed = tag.String() == "COMMIT"
			return nil
		})
		if err = c.SendBatch(ctx, next).Close(); err == nil && !committed {
			err = errors.New("commit: the transaction was rolled back")
		}
	}
	if !keep || err != nil {
		if c.Conn().PgConn().TxStatus() != 'I' {
			if _, rerr := c.Exec(ctx, "ROLLBACK"); rerr != nil {
				err = errors.Join(err, fmt.Errorf("rollback: %w", rerr))
			}
		}
		return false, err
	}
	return true, nil
}
