package pep

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/omcp/arap/mcp/tasks"
)

// The statements that open an approval task (state.go owns the tables):
// the caller's limits and the live task for the same call, the task's first
// row and its intents, and the binding of a request's handle.

// openings is what decides whether a principal may open a task: its
// recent and live approval tasks.
type openings struct {
	recent, count int
}

// queueLimitLock queues on b (sent as one transaction) principal's limit
// lock (lockLimits), held for the rest of the transaction. It is its own
// statement: the server runs a pipeline's statements in order, so the
// limits' check after it (queueLimitCheck) takes a snapshot once every
// earlier holder has committed.
func queueLimitLock(b *pgx.Batch, principal string) {
	b.Queue(`SELECT pg_advisory_xact_lock($1, hashtext($2))`, lockLimits, principal)
}

// queueLimitCheck queues on b, after principal's limit lock and the
// insert of its new approval task, the check of its openings since since
// (the new one among them) against l: over a limit, it fails the
// transaction with the limit's refusal (refusedRate, refusedOutstanding).
// After the insert, so that a live task for the same call, which the
// insert finds (the unique dedup index), is found whatever the limits.
func queueLimitCheck(b *pgx.Batch, principal string, since time.Time, l limits) {
	b.Queue(`SELECT CASE WHEN c.recent > $3 THEN pep.refuse($4) WHEN c.live > $5 THEN pep.refuse($6) END
		FROM (`+countOpeningsSQL+`) c (recent, live)`, principal, since, l.perMinute, refusedRate, l.pending, refusedOutstanding)
}

// Reasons of pep.refuse (migrations/pep/0010), which fails a transaction
// from within: the per-caller limits, a handle the task did not take, and
// an audit chain whose head moved under an append.
const (
	refusedRate        = "rate"
	refusedOutstanding = "outstanding"
	refusedHandle      = "handle-not-taken"
	refusedChainMoved  = "audit-chain-moved"
)

// refusalOf is the reason pep.refuse failed err's transaction with ("" if
// it did not).
func refusalOf(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "P0001" {
		return pgErr.Message
	}
	return ""
}

// liveTask returns the live task holding dedup key and its phase ("" if
// none).
func liveTask(ctx context.Context, q tasks.Querier, dedup string) (string, phase, error) {
	var id string
	var ph phase
	err := q.QueryRow(ctx, liveTaskSQL(), dedup).Scan(&id, &ph)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", nil
	}
	return id, ph, err
}

func liveTaskSQL() string {
	if brokenBuild && broken(violateTerminalReopened) { // the latest task for the call, ended or not
		return `SELECT task_id, 'pending' FROM pep.approval_tasks WHERE dedup_key = $1 ORDER BY created_at DESC LIMIT 1`
	}
	return `SELECT task_id, phase FROM pep.approval_tasks WHERE dedup_key = $1 AND phase <> 'done'`
}

// precheck reads, in one round trip outside any transaction, whether a live
// task holds dedup key (its id, "" if none) and principal's openings since
// since.
func precheck(ctx context.Context, db interface {
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}, dedup, principal string, since time.Time) (id string, o openings, err error) {
	b := &pgx.Batch{}
	b.Queue(liveTaskSQL(), dedup).Query(func(rows pgx.Rows) error {
		var ph phase
		for rows.Next() {
			if err := rows.Scan(&id, &ph); err != nil {
				return err
			}
		}
		return rows.Err()
	})
	b.Queue(countOpeningsSQL, principal, since).QueryRow(func(r pgx.Row) error { return r.Scan(&o.recent, &o.count) })
	return id, o, db.SendBatch(ctx, b).Close()
}

// dedupIndex is the unique index that admits one live task per call
// (principal, tool and arguments).
const dedupIndex = "approval_tasks_dedup"

// countOpeningsSQL counts principal $1's approval tasks created since $2,
// and those still live; each count is served by its own index
// (migrations/pep/0002).
const countOpeningsSQL = `SELECT
		(SELECT count(*) FROM pep.approval_tasks WHERE principal = $1 AND created_at > $2),
		(SELECT count(*) FROM pep.approval_tasks WHERE principal = $1 AND phase <> 'done')`

// newApproval is a task's first row and its first intent.
type newApproval struct {
	TaskID, Tool, ArgsDigest, Principal, Dedup string
	ArgsSealed                                 []byte
	// The identity of the tool as it was when the call was evaluated.
	ToolDigest, Upstream, UpstreamTool string
	TraceParent                        string // "" when the call is not traced
	Deferred                           bool   // run on the caller's repeat (interim.go)
	Intent                             newIntent
	At                                 time.Time
}

// newIntent is a submission intent as written, before the backend is
// contacted.
type newIntent struct {
	Key, SubmitURL string
	Generation     int
	BodySealed     []byte
}

// queueApproval queues on b (sent in a transaction) a's row, in phase
// submitting at generation 1, and its first intent.
func queueApproval(b *pgx.Batch, a newApproval) {
	b.Queue(`INSERT INTO pep.approval_tasks (task_id, tool, args_sealed, args_digest, principal, dedup_key, phase,
		generation, created_at, updated_at, tool_digest, upstream, upstream_tool, trace_parent, deferred)
		VALUES ($1, $2, $3, $4, $5, $6, 'submitting', 1, $7, $7, $8, nullif($9, ''), $10, nullif($11, ''), $12)`,
		a.TaskID, a.Tool, a.ArgsSealed, a.ArgsDigest, a.Principal, a.Dedup, a.At, a.ToolDigest, a.Upstream, a.UpstreamTool, a.TraceParent, a.Deferred)
	b.Queue(insertIntentSQL, a.Intent.Key, a.TaskID, a.Intent.Generation, a.Intent.SubmitURL, a.Intent.BodySealed, &a.At)
}

// insertIntent writes a new intent for task id, at time at (nil: the
// database's now()).
func insertIntent(ctx context.Context, tx pgx.Tx, taskID string, in newIntent, at *time.Time) error {
	_, err := tx.Exec(ctx, insertIntentSQL, in.Key, taskID, in.Generation, in.SubmitURL, in.BodySealed, at)
	return err
}

const insertIntentSQL = `INSERT INTO pep.intents (key, task_id, generation, submit_url, body_sealed, state, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, 'intent', coalesce($6, now()), coalesce($6, now()))`

// handle is what the backend returned for a submission, as it is bound,
// and when the task is first looked at.
type handle struct {
	BackendID, StatusURL, CancelURL string
	Deadline, WindowEnd, FirstLook  time.Time
}

// queueBind queues on b (sent in a transaction) h's record on intent in
// and, if the task is still submitting in.Generation, on the task
// (moveBind), which sets *bound when b's results are read.
func queueBind(b *pgx.Batch, in *intent, h handle, bound *bool) {
	sql, args := queueBindMove(b, in, h)
	b.Queue(sql, args...).
		Query(func(rows pgx.Rows) error {
			for rows.Next() {
				if err := rows.Scan(bound); err != nil {
					return err
				}
			}
			return rows.Err()
		})
}

// queueBindOrRefuse is queueBind for a batch sent as one transaction
// that holds nothing but the bind and what follows from it: a task that
// does not take the handle fails the transaction (refusedHandle).
func queueBindOrRefuse(b *pgx.Batch, in *intent, h handle) {
	sql, args := queueBindMove(b, in, h)
	b.Queue(`WITH moved AS (`+sql+`) SELECT EXISTS (SELECT FROM moved) OR pep.refuse($11)`, append(args, refusedHandle)...)
}

// queueBindMove queues on b h's record on intent in, and returns the move
// that records it on the task if the task is still submitting
// in.Generation (returning true).
func queueBindMove(b *pgx.Batch, in *intent, h handle) (string, []any) {
	sql, args := intentBind.statement(in.Key, `, backend_id = $4, status_url = $5, cancel_url = $6, deadline = $7`,
		h.BackendID, h.StatusURL, h.CancelURL, h.Deadline)
	b.Queue(sql, args...)
	return moveBind.statement(in.TaskID, `, backend_id = $5, status_url = $6, cancel_url = $7, deadline = $8, window_end = $9,
		look_at = $10, updated_at = now()`,
		` AND generation = $4`, ` RETURNING true`, in.Generation, h.BackendID, h.StatusURL, h.CancelURL, h.Deadline, h.WindowEnd, h.FirstLook)
}

// bindHandle records h on intent in and, if the task is still submitting
// in.Generation, on the task (moveBind). It reports whether the task took
// it, and otherwise which request the task holds at that generation (nil:
// none, it moved on without one).
func bindHandle(ctx context.Context, tx pgx.Tx, in *intent, h handle) (bound bool, held *string, err error) {
	// Both UPDATEs in one round trip: the second's outcome is read from
	// its rows, and only a lost move needs another look.
	b := &pgx.Batch{}
	queueBind(b, in, h, &bound)
	if err := tx.SendBatch(ctx, b).Close(); err != nil || bound {
		return bound, nil, err
	}
	err = tx.QueryRow(ctx, `SELECT backend_id FROM pep.approval_tasks WHERE task_id = $1 AND generation = $2`, in.TaskID, in.Generation).Scan(&held)
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil
	}
	return false, held, err
}

// failIntentTx settles intent in as the backend left it (intentRefused, or
// intentAbandon when the outcome is unknown) and ends its task if it is
// still submitting that generation (moveUnsubmitted); it reports whether
// the task ended here.
func failIntentTx(ctx context.Context, tx pgx.Tx, in *intent, m intentMove) (bool, error) {
	if err := m.apply(ctx, tx, in.Key, ``); err != nil {
		return false, err
	}
	var ended bool
	err := moveUnsubmitted.apply(ctx, tx, in.TaskID, `, updated_at = now()`, ` AND generation = $4`, ` RETURNING true`, in.Generation).Scan(&ended)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return ended, err
}
