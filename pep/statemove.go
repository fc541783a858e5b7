package pep

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/omcp/arap/mcp/tasks"
)

// The statements that move a bound approval task on (state.go owns the
// tables, and lists the moves): its deadline, the claim, every ending, a
// new request or in-task input, and a deferred task's approval.

// isPending reports whether task id is waiting on backend request
// backendID (so a callback about that request may wake it).
func isPending(ctx context.Context, q tasks.Querier, id, backendID string) (bool, error) {
	var current bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pep.approval_tasks WHERE task_id = $1 AND backend_id = $2 AND phase = 'pending')`,
		id, backendID).Scan(&current)
	return current, err
}

// moveDeadline moves a pending task's deadline (at generation gen) up to
// expiresAt, never past its window's end nor back; it returns the new
// deadline, or the zero time if nothing moved.
func moveDeadline(ctx context.Context, tx pgx.Tx, id string, gen int, expiresAt time.Time) (time.Time, error) {
	var deadline time.Time
	err := tx.QueryRow(ctx, `UPDATE pep.approval_tasks SET deadline = least($3::timestamptz, window_end), updated_at = now()
		WHERE task_id = $1 AND phase = 'pending' AND generation = $2 AND window_end IS NOT NULL -- least() would skip a NULL
			AND deadline < least($3::timestamptz, window_end)
		RETURNING deadline`, id, gen, expiresAt.UTC()).Scan(&deadline)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, nil // already as late as allowed, or the task moved on
	}
	return deadline, err
}

// queueClaim takes the execution claim of a (moveClaim at a's generation)
// while its caller still has a live token, in the claim's own statement,
// and schedules the task's next look at the execution deadline (which
// reaps the claim if its run was never recorded). It reports whether this
// call won, and the request it was approved in.
//
// It is queued on b (sent in a transaction): *claimed and *backendID are set
// when b's results are read (claimed false: lost to cancel, expiry or
// another runner, or the caller is gone).
func queueClaim(b *pgx.Batch, a *approvalTask, at, execDeadline time.Time, claimed *bool, backendID **string) {
	sql, args := moveClaim.statement(a.TaskID, `, claimed_at = $5, exec_deadline = $6, look_at = $6, updated_at = $5`,
		` AND generation = $4 AND `+callerLive("t.principal"), ` RETURNING backend_id`, a.Generation, at, execDeadline)
	b.Queue(sql, args...).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			*claimed = true
			if err := rows.Scan(backendID); err != nil {
				return err
			}
		}
		return rows.Err()
	})
}

// queueEnd is endTx queued on b (sent in a transaction): *ended and
// *backendID are set when b's results are read.
func queueEnd(b *pgx.Batch, a *approvalTask, m move, disposition string, ended *bool, backendID **string) {
	sql, args := m.statement(a.TaskID, `, disposition = nullif($5, ''), updated_at = now()`, ` AND generation = $4`, ` RETURNING backend_id`,
		a.Generation, disposition)
	b.Queue(sql, args...).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			*ended = true
			if err := rows.Scan(backendID); err != nil {
				return err
			}
		}
		return rows.Err()
	})
}

// endTx ends a by m (from the phase and at the generation it was read at),
// recording disposition ("" for none). It reports whether this call ended
// it, and the request it was bound to.
func endTx(ctx context.Context, tx pgx.Tx, a *approvalTask, m move, disposition string) (bool, *string, error) {
	var backendID *string
	err := m.apply(ctx, tx, a.TaskID, `, disposition = nullif($5, ''), updated_at = now()`, ` AND generation = $4`, ` RETURNING backend_id`,
		a.Generation, disposition).Scan(&backendID)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil, nil
	}
	return err == nil, backendID, err
}

// cancelTx ends task id before the claim (moveEnd, whatever its
// generation) and returns it as it was, or nil if it was claimed or ended.
func cancelTx(ctx context.Context, tx pgx.Tx, id string) (*approvalTask, error) {
	a, err := scanApproval(moveEnd.apply(ctx, tx, id, `, updated_at = now()`, ``, ` RETURNING `+approvalColumns))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return a, nil
}

// askTx consumes a's generation and waits for the input a new request
// needs (moveAsk) until until (within the task's window), when its look
// (set here, in the move's own UPDATE) ends it if no answer came; it
// reports whether it moved.
func askTx(ctx context.Context, tx pgx.Tx, a *approvalTask, schema map[string]any, until time.Time) (bool, error) {
	var moved bool
	err := moveAsk.apply(ctx, tx, a.TaskID, `, generation = generation + 1, chained = chained + 1,
		backend_id = NULL, status_url = NULL, cancel_url = NULL, input_schema = $5, approved_until = NULL,
		deadline = least($6::timestamptz, window_end), look_at = least($6::timestamptz, window_end), updated_at = now()`,
		` AND generation = $4`, ` RETURNING true`, a.Generation, schema, until.UTC()).Scan(&moved)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return moved, err
}

// resubmitTx moves a (by m, from the generation it was read at) back to
// submitting at generation gen with one more chained request if chained,
// and writes the new request's intent; it reports whether it moved.
func resubmitTx(ctx context.Context, tx pgx.Tx, a *approvalTask, m move, gen int, chained bool, in newIntent) (bool, error) {
	inc := 0
	if chained {
		inc = 1
	}
	var moved bool
	err := m.apply(ctx, tx, a.TaskID, `, generation = $5, chained = chained + $6,
		backend_id = NULL, status_url = NULL, cancel_url = NULL, input_schema = NULL, approved_until = NULL, updated_at = now()`,
		` AND generation = $4`, ` RETURNING true`, a.Generation, gen, inc).Scan(&moved)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	in.Generation = gen
	return true, insertIntent(ctx, tx, a.TaskID, in, nil)
}

// markApproved records on deferred task a (pending, at the generation it
// was read at) that its request's approval lasts until until: the task now
// waits for its caller's repeat. It reports whether it changed anything.
func markApproved(ctx context.Context, tx pgx.Tx, a *approvalTask, until time.Time) (bool, error) {
	tag, err := tx.Exec(ctx, `UPDATE pep.approval_tasks SET approved_until = $3, updated_at = now()
		WHERE task_id = $1 AND phase = 'pending' AND generation = $2 AND deferred AND approved_until IS DISTINCT FROM $3`,
		a.TaskID, a.Generation, until.UTC())
	return tag.RowsAffected() == 1, err
}

// undefer makes deferred task id an ordinary one (its caller now drives
// tasks): it runs as soon as it is approved, its look brought forward to
// at. It reports whether the task was deferred.
func undefer(ctx context.Context, q querier, id string, at time.Time) (bool, error) {
	tag, err := q.Exec(ctx, `UPDATE pep.approval_tasks SET deferred = false, look_at = CASE WHEN phase = 'pending' THEN $2 ELSE look_at END
		WHERE task_id = $1 AND deferred AND phase <> 'done'`, id, at)
	return tag.RowsAffected() == 1, err
}
