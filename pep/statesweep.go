package pep

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// The statements of the background sweeps (state.go owns the tables): the
// reconciler's leases of idle intents, and the looks (look.go) the sweep
// takes, schedules and brings forward.

// leaseIntent takes intent key for this run if it is still in state and
// has been idle since before idleBefore; only one replica gets it.
func leaseIntent(ctx context.Context, q querier, key string, state intentState, idleBefore time.Time) (bool, error) {
	tag, err := q.Exec(ctx, `UPDATE pep.intents SET updated_at = now() WHERE key = $1 AND state = $2 AND updated_at < $3`,
		key, string(state), idleBefore)
	return tag.RowsAffected() == 1, err
}

// openIntent is an intent Reconcile may have to repair.
type openIntent struct {
	key   string
	state intentState
}

// idleIntents lists (at most 100) intents not bound nor settled, idle since
// before idleBefore, oldest first.
func idleIntents(ctx context.Context, q querier, idleBefore time.Time) ([]openIntent, error) {
	rows, err := q.Query(ctx, `SELECT key, state FROM pep.intents WHERE state = ANY($1) AND updated_at < $2 ORDER BY updated_at LIMIT 100`,
		[]string{string(intentOpen), string(intentAbandoned)}, idleBefore)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (openIntent, error) {
		var o openIntent
		return o, r.Scan(&o.key, &o.state)
	})
}

// takeLooks leases (at most n of) the tasks whose look is due at now for one
// look each: their next look moves to until, so that no other replica takes
// them before that unless the look schedules an earlier one, and a replica
// that dies mid-look leaves its tasks to be taken again then. Replicas skip
// each other's locked rows. Only waiting (for a decision or for input) and
// running tasks are looked at (the partial index approval_tasks_look holds
// nothing else).
func takeLooks(ctx context.Context, q querier, now, until time.Time, n int) ([]string, error) {
	rows, err := q.Query(ctx, `UPDATE pep.approval_tasks SET look_at = $2
		WHERE task_id = ANY (ARRAY(SELECT task_id FROM pep.approval_tasks
			WHERE look_at <= $1 AND phase IN ('pending', 'claimed', 'input') ORDER BY look_at LIMIT $3 FOR UPDATE SKIP LOCKED))
		RETURNING task_id`, now, until, n)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// scheduleLook sets a's next look at at, if a is still in the phase and at
// the generation it was read in, and nobody scheduled another look since it
// was read; if somebody did (a callback bringing the look forward, another
// replica's look or lease), the sooner of the two stands. A task that moved
// meanwhile keeps what its move set (a claim's execution deadline, a new
// request's first look) or needs none (it ended, or waits for input).
func scheduleLook(ctx context.Context, q querier, a *approvalTask, at time.Time) error {
	_, err := q.Exec(ctx, `UPDATE pep.approval_tasks SET look_at = CASE WHEN look_at IS NOT DISTINCT FROM $4 THEN $5 ELSE least(look_at, $5) END
		WHERE task_id = $1 AND phase = $2 AND generation = $3`, a.TaskID, string(a.Phase), a.Generation, a.LookAt, at)
	return err
}

// lookSoon brings task id's next look forward to at, if it waits or runs
// and its look is later (or unset).
func lookSoon(ctx context.Context, q querier, id string, at time.Time) error {
	_, err := q.Exec(ctx, `UPDATE pep.approval_tasks SET look_at = $2
		WHERE task_id = $1 AND phase IN ('pending', 'claimed') AND (look_at IS NULL OR look_at > $2)`, id, at)
	return err
}
