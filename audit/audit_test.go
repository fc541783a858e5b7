package audit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func appendEvents(t *testing.T, db *pgxpool.Pool, chain string, n int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		require.NoError(t, pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			return audit.Append(ctx, tx, audit.Event{Chain: chain, Kind: "test.event", Actor: "system",
				At: time.Date(2026, 11, 1, 0, 0, i, 123456789, time.UTC), Data: map[string]any{"i": i, "amount": 50000.5, "note": "<b>&"}})
		}))
	}
}

func TestVerifyAcceptsIntactChains(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	appendEvents(t, db, "arq_a", 3)
	appendEvents(t, db, "arq_b", 2)
	rep, err := audit.Verify(ctx, db)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", rep.Breaks)
	require.Equal(t, 2, rep.Chains)
	require.Equal(t, 5, rep.Events)

	recs, err := audit.Chain(ctx, db, "arq_a")
	require.NoError(t, err)
	require.Len(t, recs, 3)
	require.Equal(t, recs[0].Hash, recs[1].PrevHash)
	require.Empty(t, recs[0].PrevHash)
}

func TestVerifyFindsTampering(t *testing.T) {
	cases := map[string]struct {
		sql     string
		problem string
	}{
		"changed data":   {`UPDATE arap.audit_events SET data = jsonb_set(data, '{amount}', '1') WHERE chain = 'arq_x' AND seq = 2`, "contents"},
		"changed actor":  {`UPDATE arap.audit_events SET actor = 'user:mallory' WHERE chain = 'arq_x' AND seq = 2`, "contents"},
		"removed event":  {`DELETE FROM arap.audit_events WHERE chain = 'arq_x' AND seq = 2`, "sequence gap"},
		"rewritten link": {`UPDATE arap.audit_events SET prev_hash = '\x00' WHERE chain = 'arq_x' AND seq = 2`, "prev_hash"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			db := dbtest.New(t)
			appendEvents(t, db, "arq_x", 4)
			appendEvents(t, db, "arq_ok", 2)
			_, err := db.Exec(ctx, tc.sql)
			require.NoError(t, err)
			rep, err := audit.Verify(ctx, db)
			require.NoError(t, err)
			require.Len(t, rep.Breaks, 1, "only the tampered chain breaks, once")
			b := rep.Breaks[0]
			require.Equal(t, "arq_x", b.Chain)
			require.Contains(t, b.Problem, tc.problem)
			if name != "removed event" {
				require.EqualValues(t, 2, b.Seq)
			} else {
				require.EqualValues(t, 3, b.Seq)
			}
		})
	}
}

func TestExportWritesJSONLines(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	appendEvents(t, db, "arq_e", 2)
	var buf bytes.Buffer
	require.NoError(t, audit.Export(ctx, db, &buf))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 2)
	var r audit.Record
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &r))
	require.Equal(t, "arq_e", r.Chain)
	require.EqualValues(t, 2, r.Seq)
}

// AppendMany continues existing chains and starts new ones, several events
// of one chain in order, and what it writes verifies like Append's.
func TestAppendManyExtendsChains(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	appendEvents(t, db, "arq_a", 2)
	at := time.Date(2026, 11, 2, 0, 0, 0, 987654321, time.UTC)
	require.NoError(t, pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		return audit.AppendMany(ctx, tx, []audit.Event{
			{Chain: "arq_b", Kind: "request.submitted", Actor: "client:x", At: at},
			{Chain: "arq_a", Kind: "request.expired", Actor: "system", At: at, Data: map[string]any{"reason": "timeout"}},
			{Chain: "arq_b", Kind: "request.expired", Actor: "system", At: at.Add(time.Second)},
		})
	}))
	appendEvents(t, db, "arq_b", 1)
	rep, err := audit.Verify(ctx, db)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", rep.Breaks)
	require.Equal(t, 6, rep.Events)
	a, err := audit.Chain(ctx, db, "arq_a")
	require.NoError(t, err)
	require.Len(t, a, 3)
	require.Equal(t, "request.expired", a[2].Kind)
	require.Equal(t, a[1].Hash, a[2].PrevHash)
	b, err := audit.Chain(ctx, db, "arq_b")
	require.NoError(t, err)
	require.Len(t, b, 3)
	require.Empty(t, b[0].PrevHash)
	require.Equal(t, []string{"request.submitted", "request.expired", "test.event"}, []string{b[0].Kind, b[1].Kind, b[2].Kind})
	require.EqualValues(t, 3, b[2].Seq)

	require.Error(t, pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		return audit.AppendMany(ctx, tx, []audit.Event{{Chain: "arq_c", Kind: "x"}})
	}), "an event without an actor is refused")
}

// QueueFirst starts a chain in the caller's batch; on a chain that exists
// after all it fails rather than fork it, and the chain is left as it was.
func TestQueueFirstNeverForksAChain(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	send := func(chain string) error {
		return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			b := &pgx.Batch{}
			if err := audit.QueueFirst(b, audit.Event{Chain: chain, Kind: "request.submitted", Actor: "client:x"}); err != nil {
				return err
			}
			return tx.SendBatch(ctx, b).Close()
		})
	}
	require.NoError(t, send("arq_new"))
	appendEvents(t, db, "arq_new", 1)
	appendEvents(t, db, "arq_old", 2)
	require.Error(t, send("arq_old"), "seq 1 exists")
	old, err := audit.Chain(ctx, db, "arq_old")
	require.NoError(t, err)
	require.Len(t, old, 2)
	require.Equal(t, "test.event", old[0].Kind)
	rep, err := audit.Verify(ctx, db)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", rep.Breaks)
	require.Equal(t, 4, rep.Events)
}
