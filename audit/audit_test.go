package audit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/migrations"
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

// TestVerifyFindsTampering changes, removes or reorders what is stored, one
// column at a time, and requires Verify to name the chain and the point
// where it breaks, and nothing else. Every column of both tables is
// tampered with by some case (the test reads the columns from the catalog,
// so a new column needs a case), but for audit_events.id, the row's storage
// key: the order of a chain is its seq.
func TestVerifyFindsTampering(t *testing.T) {
	type want struct {
		chain   string
		seq     int64
		problem string
	}
	// arq_x has events 1-4, arq_ok 1-2, all appended by audit.Append.
	cases := []struct {
		name    string
		columns []string // the columns the case tampers with, "table.column"
		sql     []string
		breaks  []want
	}{
		{"changed data", []string{"audit_events.data"},
			[]string{`UPDATE arap.audit_events SET data = jsonb_set(data, '{amount}', '1') WHERE chain = 'arq_x' AND seq = 2`},
			[]want{{"arq_x", 2, "contents"}}},
		{"changed actor", []string{"audit_events.actor"},
			[]string{`UPDATE arap.audit_events SET actor = 'user:mallory' WHERE chain = 'arq_x' AND seq = 2`},
			[]want{{"arq_x", 2, "contents"}}},
		{"changed kind", []string{"audit_events.kind"},
			[]string{`UPDATE arap.audit_events SET kind = 'request.approved' WHERE chain = 'arq_x' AND seq = 2`},
			[]want{{"arq_x", 2, "contents"}}},
		{"changed time by a microsecond", []string{"audit_events.at"},
			[]string{`UPDATE arap.audit_events SET at = at + interval '1 microsecond' WHERE chain = 'arq_x' AND seq = 2`},
			[]want{{"arq_x", 2, "contents"}}},
		{"changed hash", []string{"audit_events.hash"},
			[]string{`UPDATE arap.audit_events SET hash = '\x00' WHERE chain = 'arq_x' AND seq = 2`},
			[]want{{"arq_x", 2, "contents"}}},
		{"rewritten link", []string{"audit_events.prev_hash"},
			[]string{`UPDATE arap.audit_events SET prev_hash = '\x00' WHERE chain = 'arq_x' AND seq = 2`},
			[]want{{"arq_x", 2, "prev_hash"}}},
		{"removed event", nil,
			[]string{`DELETE FROM arap.audit_events WHERE chain = 'arq_x' AND seq = 2`},
			[]want{{"arq_x", 3, "sequence gap"}}},
		{"renumbered event", []string{"audit_events.seq"},
			[]string{`DELETE FROM arap.audit_events WHERE chain = 'arq_x' AND seq = 3`,
				`UPDATE arap.audit_events SET seq = 3 WHERE chain = 'arq_x' AND seq = 4`,
				`UPDATE arap.audit_heads SET seq = 3 WHERE chain = 'arq_x'`},
			[]want{{"arq_x", 3, "prev_hash"}}},
		{"reordered events", []string{"audit_events.seq"},
			[]string{`UPDATE arap.audit_events SET seq = -2 WHERE chain = 'arq_x' AND seq = 2`,
				`UPDATE arap.audit_events SET seq = 2 WHERE chain = 'arq_x' AND seq = 3`,
				`UPDATE arap.audit_events SET seq = 3 WHERE chain = 'arq_x' AND seq = -2`},
			[]want{{"arq_x", 2, "prev_hash"}}},
		{"event moved to another chain", []string{"audit_events.chain"},
			[]string{`UPDATE arap.audit_events SET chain = 'arq_ok' WHERE chain = 'arq_x' AND seq = 3`},
			[]want{{"arq_ok", 3, "prev_hash"}, {"arq_x", 4, "sequence gap"}}},
		{"last event removed", nil,
			[]string{`DELETE FROM arap.audit_events WHERE chain = 'arq_x' AND seq = 4`},
			[]want{{"arq_x", 4, "removed from its end"}}},
		{"last two events removed", nil,
			[]string{`DELETE FROM arap.audit_events WHERE chain = 'arq_x' AND seq >= 3`},
			[]want{{"arq_x", 3, "removed from its end"}}},
		{"every event removed", nil,
			[]string{`DELETE FROM arap.audit_events WHERE chain = 'arq_x'`},
			[]want{{"arq_x", 4, "no events"}}},
		{"last event removed and head rewound", []string{"audit_heads.seq"},
			[]string{`DELETE FROM arap.audit_events WHERE chain = 'arq_x' AND seq = 4`,
				`UPDATE arap.audit_heads SET seq = 3 WHERE chain = 'arq_x'`},
			[]want{{"arq_x", 3, "not the one the head records"}}},
		{"head rewound", []string{"audit_heads.seq", "audit_heads.hash"},
			[]string{`UPDATE arap.audit_heads h SET seq = 3, hash = e.hash FROM arap.audit_events e
				WHERE h.chain = 'arq_x' AND e.chain = 'arq_x' AND e.seq = 3`},
			[]want{{"arq_x", 4, "goes on past its head"}}},
		{"last event replaced", []string{"audit_events.hash"},
			[]string{`UPDATE arap.audit_events SET hash = '\x01', kind = 'x' WHERE chain = 'arq_x' AND seq = 4`},
			[]want{{"arq_x", 4, "contents"}}},
		{"head hash changed", []string{"audit_heads.hash"},
			[]string{`UPDATE arap.audit_heads SET hash = '\x00' WHERE chain = 'arq_x'`},
			[]want{{"arq_x", 4, "not the one the head records"}}},
		{"head removed", nil,
			[]string{`DELETE FROM arap.audit_heads WHERE chain = 'arq_x'`},
			[]want{{"arq_x", 4, "no head"}}},
		{"head moved to another chain", []string{"audit_heads.chain"},
			[]string{`DELETE FROM arap.audit_heads WHERE chain = 'arq_ok'`,
				`UPDATE arap.audit_heads SET chain = 'arq_ok' WHERE chain = 'arq_x'`},
			[]want{{"arq_ok", 3, "removed from its end"}, {"arq_x", 4, "no head"}}},
	}

	t.Run("every column is tampered with", func(t *testing.T) {
		db := dbtest.New(t)
		rows, err := db.Query(context.Background(), `SELECT c.relname || '.' || a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
			WHERE c.relnamespace = 'arap'::regnamespace AND c.relname IN ('audit_events', 'audit_heads') AND a.attnum > 0 AND NOT a.attisdropped`)
		require.NoError(t, err)
		columns, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		// id and txid are positions (row id, stream order), not hashed: a
		// moved event shows in a stream reader's copy as a seq gap.
		covered := map[string]bool{"audit_events.id": true, "audit_events.txid": true}
		for _, tc := range cases {
			for _, c := range tc.columns {
				covered[c] = true
			}
		}
		for _, c := range columns {
			require.True(t, covered[c], "no case tampers with %s", c)
		}
	})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			db := dbtest.New(t)
			appendEvents(t, db, "arq_x", 4)
			appendEvents(t, db, "arq_ok", 2)
			rep, err := audit.Verify(ctx, db)
			require.NoError(t, err)
			require.True(t, rep.OK(), "%v", rep.Breaks)
			for _, q := range tc.sql {
				tag, err := db.Exec(ctx, q)
				require.NoError(t, err)
				require.Positive(t, tag.RowsAffected(), q)
			}
			rep, err = audit.Verify(ctx, db)
			require.NoError(t, err)
			var got []want
			for _, b := range rep.Breaks {
				got = append(got, want{b.Chain, b.Seq, b.Problem})
			}
			require.Len(t, got, len(tc.breaks), "%v", rep.Breaks)
			for i, w := range tc.breaks {
				require.Equal(t, w.chain, got[i].chain, "%v", rep.Breaks)
				require.Equal(t, w.seq, got[i].seq, "%v", rep.Breaks)
				require.Contains(t, got[i].problem, w.problem)
			}
		})
	}
}

// TestHeadsFollowEveryAppend: Append, AppendMany and QueueFirst each leave
// every chain's head at its last event, from several goroutines at once,
// and Verify finds nothing amiss.
func TestHeadsFollowEveryAppend(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	var wg sync.WaitGroup
	const writers, each = 6, 8
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				errs <- pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
					if w%2 == 0 {
						return audit.Append(ctx, tx, audit.Event{Chain: "arq_shared", Kind: "test.append", Actor: "system", Data: map[string]any{"w": w, "i": i}})
					}
					return audit.AppendMany(ctx, tx, []audit.Event{
						{Chain: "arq_shared", Kind: "test.many", Actor: "system"},
						{Chain: fmt.Sprintf("arq_w%d", w), Kind: "test.many", Actor: "system"},
						{Chain: "arq_shared", Kind: "test.many", Actor: "system"},
					})
				})
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		if err := audit.QueueFirst(b, audit.Event{Chain: "arq_first", Kind: "request.submitted", Actor: "client:x"}); err != nil {
			return err
		}
		return tx.SendBatch(ctx, b).Close()
	}))
	rows, err := db.Query(ctx, `SELECT h.chain, h.seq, h.hash = e.hash, (SELECT max(seq) FROM arap.audit_events WHERE chain = h.chain)
		FROM arap.audit_heads h LEFT JOIN arap.audit_events e ON e.chain = h.chain AND e.seq = h.seq ORDER BY h.chain`)
	require.NoError(t, err)
	type head struct {
		Chain    string
		Seq      int64
		SameHash bool
		Last     int64
	}
	heads, err := pgx.CollectRows(rows, pgx.RowToStructByPos[head])
	require.NoError(t, err)
	shared := int64(writers/2*each + writers/2*each*2)
	require.Equal(t, []head{{"arq_first", 1, true, 1}, {"arq_shared", shared, true, shared},
		{"arq_w1", each, true, each}, {"arq_w3", each, true, each}, {"arq_w5", each, true, each}}, heads)
	rep, err := audit.Verify(ctx, db)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", rep.Breaks)
	require.Equal(t, 5, rep.Chains)
}

// TestHeadsMigrationBackfills: chains written before the heads table
// existed get their heads from migration 0009, and verify.
func TestHeadsMigrationBackfills(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	appendEvents(t, db, "arq_a", 3)
	appendEvents(t, db, audit.SystemChain, 2)
	all, err := migrations.All()
	require.NoError(t, err)
	var sql string
	for _, m := range all {
		if m.Schema == "arap" && m.Name == "audit_heads" {
			sql = m.SQL
		}
	}
	require.NotEmpty(t, sql, "migration arap/audit_heads")
	_, err = db.Exec(ctx, `DROP TABLE arap.audit_heads`)
	require.NoError(t, err)
	rep, err := audit.Verify(ctx, db)
	require.Error(t, err, "no heads table")
	_, err = db.Exec(ctx, sql)
	require.NoError(t, err)
	rep, err = audit.Verify(ctx, db)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", rep.Breaks)
	require.Equal(t, 2, rep.Chains)
	appendEvents(t, db, "arq_a", 1)
	_, err = db.Exec(ctx, `DELETE FROM arap.audit_events WHERE chain = 'arq_a' AND seq = 4`)
	require.NoError(t, err)
	rep, err = audit.Verify(ctx, db)
	require.NoError(t, err)
	require.Len(t, rep.Breaks, 1)
	require.Equal(t, "chain arq_a: seq 4: missing: the chain ends at seq 3 but its head records seq 4 (events were removed from its end)", rep.Breaks[0].String())
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
