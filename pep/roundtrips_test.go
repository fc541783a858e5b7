package pep_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// roundTrips counts the front-end's statements as PostgreSQL sees them:
// each statement sent alone is a round trip, and so is each pipelined
// batch, however many statements it holds. Commits are COMMITs, and the
// writing batches sent outside a transaction (each is one, implicitly).
type roundTrips struct {
	mu             sync.Mutex
	trips, commits int
	statements     []string
}

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trips++
	if strings.EqualFold(strings.TrimSpace(d.SQL), "commit") {
		r.commits++
	}
	r.statements = append(r.statements, d.SQL)
	return ctx
}

func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *roundTrips) TraceBatchStart(ctx context.Context, c *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trips++
	implicit, writes := c.PgConn().TxStatus() == 'I', false
	for _, q := range d.Batch.QueuedQueries {
		r.statements = append(r.statements, "batch: "+q.SQL)
		switch sql := strings.ToUpper(strings.TrimSpace(q.SQL)); {
		case sql == "COMMIT":
			r.commits++
		case sql == "BEGIN":
			implicit = false
		case strings.Contains(sql, "INSERT INTO") || strings.Contains(sql, "UPDATE "):
			writes = true
		}
	}
	if implicit && writes {
		r.commits++
	}
	return ctx
}

func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

func (r *roundTrips) reset() (trips, commits int, statements []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	trips, commits, statements = r.trips, r.commits, r.statements
	r.trips, r.commits, r.statements = 0, 0, nil
	return trips, commits, statements
}

// tracedPool is a second pool on db's database whose statements r counts.
func tracedPool(t *testing.T, db *pgxpool.Pool, r *roundTrips) *pgxpool.Pool {
	cfg := db.Config().Copy()
	cfg.ConnConfig.Tracer = r
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// TestGateRoundTrips counts the front-end's PostgreSQL round trips and
// commits for a gated call, from tools/call to CreateTaskResult. Two
// commits are required (the intent before the backend is contacted, the
// handle before the result); every other statement is pipelined into
// them. The budget is the count as built: a change that adds a round trip
// to the gate fails here.
func TestGateRoundTrips(t *testing.T) {
	r := &roundTrips{}
	p := newPEP(t, pepOptions{tracer: r})
	p.transfer(t, 30001) // warm-up: caller memory, rate-limit lease, catalog
	var lsn0 string
	require.NoError(t, p.db.QueryRow(context.Background(), `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn0))
	r.reset()
	const calls = 5
	for i := range calls {
		p.transfer(t, 40000+i)
	}
	trips, commits, statements := r.reset()
	var wal int64
	require.NoError(t, p.db.QueryRow(context.Background(), `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::bigint`, lsn0).Scan(&wal))
	t.Logf("WAL per gated call, both processes (the cluster's, River's polling included): %d bytes", wal/calls)
	t.Logf("per gated call: %.1f round trips, %.1f commits; statements:\n%s", float64(trips)/calls, float64(commits)/calls, strings.Join(statements[:len(statements)/calls], "\n"))
	require.Equal(t, 2*calls, commits, "two commits per gated call")
	require.LessOrEqual(t, trips, gateRoundTrips*calls, "round trips per gated call")
	// A notification in a writing transaction serializes commits
	// (tasks.Store.QueueCreate); the new task's id is no one's yet.
	for _, s := range statements {
		require.NotContains(t, s, "pg_notify", "a gated call's transactions announce nothing")
	}
}

// gateRoundTrips is the budget per gated call: the caller lookup (the
// caller memory is off in these tests); the intent's transaction, the
// limit lock, the limits' check and the three INSERTs as one pipeline in an
// implicit transaction; the handle's, both bind UPDATEs and the TTL UPDATE
// (which returns the task) likewise. (The dedup and limit precheck runs
// only before a call is asked for input.)
const gateRoundTrips = 3

// TestApprovalRoundTrips counts the front-end's PostgreSQL round trips and
// commits from an approval to the task's completion: the look (the task
// read), the claim (committed before the tool runs), the tool's own write
// (the demo ledger's) and the outcome. The budget is the count as built.
func TestApprovalRoundTrips(t *testing.T) {
	r := &roundTrips{}
	p := newPEP(t, pepOptions{tracer: r})
	const calls = 5
	var ids []string
	for i := range calls {
		id := p.transfer(t, 50400+i)
		p.approve(t, p.request(t, id), time.Time{})
		ids = append(ids, id)
	}
	p.advance(t, p.transfer(t, 50499)) // warm-up: the statements' preparation
	r.reset()
	for _, id := range ids {
		p.advance(t, id)
		require.Equal(t, 1, p.ledger(t, id))
	}
	trips, commits, statements := r.reset()
	t.Logf("per approved task: %.1f round trips, %.1f commits; statements:\n%s", float64(trips)/calls, float64(commits)/calls,
		strings.Join(statements[:len(statements)/calls], "\n"))
	require.Equal(t, 2*calls, commits, "the claim and the outcome (the tool's write commits by itself)")
	require.LessOrEqual(t, trips, approvalRoundTrips*calls, "round trips per approved task")
}

// approvalRoundTrips is the budget per approved task: the task's read; the
// claim's transaction (BEGIN, the claim, the TTL and the audit head as one
// pipeline; the claim's audit event and COMMIT as another); the demo
// tool's ledger row; the outcome's transaction (BEGIN, the end, the
// completion and the audit head; its audit event and COMMIT); and the
// test's own ledger count. Each transaction took six before it was
// pipelined, three before its audit event went with its COMMIT.
const approvalRoundTrips = 7
