package pep

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// inTx runs b's statements in one transaction whose BEGIN is sent with
// them, as one pipeline (one round trip); then, once b's results have been
// read, then (nil: commit at once) runs on the transaction what must follow
// them and says whether to commit, or to roll back. It reports whether the
// transaction was committed: two round trips for what pgx.BeginFunc does in
// two more (and one for each statement then runs). A statement that fails
// rolls the transaction back and is the error.
func inTx(ctx context.Context, db *pgxpool.Pool, b *pgx.Batch, then func(q querier) (bool, error)) (bool, error) {
	c, err := db.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer c.Release() // a connection left in a transaction is closed, not reused
	full := &pgx.Batch{}
	full.Queue("BEGIN")
	full.QueuedQueries = append(full.QueuedQueries, b.QueuedQueries...)
	err = c.SendBatch(ctx, full).Close()
	keep := err == nil
	if keep && then != nil {
		keep, err = then(c)
	}
	if !keep || err != nil {
		if c.Conn().PgConn().TxStatus() != 'I' {
			if _, rerr := c.Exec(ctx, "ROLLBACK"); rerr != nil {
				err = errors.Join(err, fmt.Errorf("rollback: %w", rerr))
			}
		}
		return false, err
	}
	tag, err := c.Exec(ctx, "COMMIT")
	if err == nil && tag.String() != "COMMIT" {
		err = errors.New("commit: the transaction was rolled back")
	}
	return err == nil, err
}
