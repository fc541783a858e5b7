package passkeytest

import (
	"github.com/omcp/arap/audit"

	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	hashchain "github.com/omcp/arap/internal/chain"
)

// Exec runs a statement; *pgxpool.Pool and pgx.Tx both do.
type Exec interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Rehash recomputes the hash chain of audit chain from its first event on,
// and its head, as someone with write access to the database would after
// changing an event: the audit hash chain is unkeyed, so it verifies again.
// (The link hash is the audit package's: SHA-256(prev || JCS({chain, seq,
// at, kind, actor, data})).)
func Rehash(ctx context.Context, db Exec, chain string) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// Events still being appended (a callback delivered, say) wait, and
	// then link to the rewritten head.
	if err := audit.LockChain(ctx, tx, chain); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, `SELECT id, seq, at, kind, actor, data::text FROM arap.audit_events WHERE chain = $1 ORDER BY seq`, chain)
	if err != nil {
		return err
	}
	type ev struct {
		id, seq     int64
		at          time.Time
		kind, actor string
		data        string
	}
	var evs []ev
	for rows.Next() {
		var e ev
		if err := rows.Scan(&e.id, &e.seq, &e.at, &e.kind, &e.actor, &e.data); err != nil {
			return err
		}
		evs = append(evs, e)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	var prev []byte
	for _, e := range evs {
		h, err := hashchain.Hash(prev, map[string]any{"chain": chain, "seq": e.seq, "at": e.at.UTC().Format(time.RFC3339Nano),
			"kind": e.kind, "actor": e.actor, "data": json.RawMessage(e.data)})
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE arap.audit_events SET prev_hash = $2, hash = $3 WHERE id = $1`, e.id, prev, h); err != nil {
			return err
		}
		prev = h
	}
	if _, err := tx.Exec(ctx, `UPDATE arap.audit_heads SET hash = $2 WHERE chain = $1`, chain, prev); err != nil {
		return fmt.Errorf("passkeytest: move head: %w", err)
	}
	return tx.Commit(ctx)
}
