package pep

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/internal/dbtest"
)

// TestAppendRefusedWhenTheHeadMoved: an append made from a head that has
// moved since it was read fails its transaction, whether it is sent alone
// or with the COMMIT, and writes nothing, even where its event's seq is
// free (the chain's last event was removed, so only the head tells).
func TestAppendRefusedWhenTheHeadMoved(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	g, err := NewGate(Config{DB: db, Backend: &arapclient.Client{BaseURL: "http://127.0.0.1:9"}, MasterKey: make([]byte, 32), Tools: DemoTools()})
	require.NoError(t, err)
	const id = "tsk_moved"
	at := time.Now()
	for _, kind := range []string{"first", "second"} {
		require.NoError(t, pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return g.audit(ctx, tx, id, kind, actorPEP, at, nil) }))
	}
	var stale auditHead
	require.NoError(t, scanAuditHead(db.QueryRow(ctx, `SELECT seq, hash FROM pep.audit_events WHERE chain = $1 AND seq = 1`, id), &stale))
	_, err = db.Exec(ctx, `DELETE FROM pep.audit_events WHERE chain = $1 AND seq = 2`, id)
	require.NoError(t, err)
	events := func() int {
		var n int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM pep.audit_events WHERE chain = $1`, id).Scan(&n))
		return n
	}

	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return g.appendAudit(ctx, tx, stale, id, "alone", actorPEP, at, nil) })
	require.ErrorContains(t, err, "chain tsk_moved moved during the append")
	require.Equal(t, 1, events())

	b := &pgx.Batch{}
	b.Queue(`SELECT 1`)
	ok, err := inTx(ctx, db, b, func(next *pgx.Batch) (bool, error) {
		return true, queueAppendAudit(next, stale, id, "with-commit", actorPEP, at, nil)
	})
	require.False(t, ok)
	require.ErrorContains(t, movedChain("with-commit", id, err), "chain tsk_moved moved during the append")
	require.Equal(t, 1, events())
	var seq int64
	require.NoError(t, db.QueryRow(ctx, `SELECT seq FROM pep.audit_heads WHERE chain = $1`, id).Scan(&seq))
	require.Equal(t, int64(2), seq, "the head stays where it was")
}
