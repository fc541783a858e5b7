package pep

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/omcp/arap/mcp/tasks"
)

// This file owns pep.approval_tasks and pep.intents: every statement on
// them is here, and nowhere else (TestOneOwnerPerTable). An approval task's
// phase and an intent's state change only by a move: one conditional UPDATE
// from the states it names to one listed transition (TestTransitions
// enumerates them). The callers (open, advance, execute, end, the Kind)
// compose these statements with the task store and the audit trail in
// their own transactions.

// phase is where an approval task is in its life (pep.approval_tasks.phase).
// The task's wire status (mcp/tasks) is working through submitting, pending
// and claimed, input_required in input, and its terminal status in done.
type phase string

const (
	phaseSubmitting phase = "submitting" // intent written; handle not yet bound
	phasePending    phase = "pending"    // waiting for the backend's decision
	phaseInput      phase = "input"      // waiting for in-task input to open a new request
	phaseClaimed    phase = "claimed"    // execution claimed: the tool runs at most once
	phaseDone       phase = "done"       // ended; never changes again
)

// allPhases lists every phase.
var allPhases = []phase{phaseSubmitting, phasePending, phaseInput, phaseClaimed, phaseDone}

// phaseTransitions lists every allowed phase change, and nothing else may
// happen: a task is bound, then either claimed (and then done with the
// run's outcome) or moved on to a new request (chained, maybe through
// input), or it ends before the claim (denied, failed or cancelled).
var phaseTransitions = map[phase][]phase{
	phaseSubmitting: {phasePending, phaseDone},
	phasePending:    {phaseClaimed, phaseInput, phaseSubmitting, phaseDone},
	phaseInput:      {phaseSubmitting, phaseDone},
	phaseClaimed:    {phaseDone},
}

// preClaim are the phases from which a task can still be denied, failed or
// cancelled: before the execution claim.
var preClaim = []phase{phaseSubmitting, phasePending, phaseInput}

// A move is one phase transition as an UPDATE applies it: from any of from
// to to, conditional on the phase (and, where it names one, the generation)
// the caller read.
type move struct {
	from []phase
	to   phase
}

// The moves; each is a listed transition (TestTransitions).
var (
	moveBind        = move{[]phase{phaseSubmitting}, phasePending} // the handle is bound
	moveUnsubmitted = move{[]phase{phaseSubmitting}, phaseDone}    // the request could not be made
	moveClaim       = move{[]phase{phasePending}, phaseClaimed}    // the execution claim
	moveAsk         = move{[]phase{phasePending}, phaseInput}      // a new request needs input first
	moveChain       = move{[]phase{phasePending}, phaseSubmitting} // a new request for the same call
	moveAnswered    = move{[]phase{phaseInput}, phaseSubmitting}   // the input came: the new request
	moveRan         = move{[]phase{phaseClaimed}, phaseDone}       // the run's outcome, or outcome unknown
	moveEnd         = move{preClaim, phaseDone}                    // denied, failed or cancelled before the claim
	moves           = []move{moveBind, moveUnsubmitted, moveClaim, moveAsk, moveChain, moveAnswered, moveRan, moveEnd}
)

// canMove reports whether a task may go from phase from to phase to.
func canMove(from, to phase) bool { return slices.Contains(phaseTransitions[from], to) }

// apply runs m on task id as one conditional UPDATE: $1 is the task, $2
// the new phase, $3 the phases it may leave; set adds assignments and where
// conditions (parameters from $4, the arguments after id), returning what to
// return. It is the only statement that writes a phase.
func (m move) apply(ctx context.Context, q querier, id, set, where, returning string, args ...any) pgx.Row {
	sql, args := m.statement(id, set, where, returning, args...)
	return q.QueryRow(ctx, sql, args...)
}

// statement is the UPDATE apply runs, with its arguments, for a caller that
// pipelines it.
func (m move) statement(id, set, where, returning string, args ...any) (string, []any) {
	sql := `UPDATE pep.approval_tasks t SET phase = $2` + set + ` WHERE task_id = $1 AND phase = ANY($3)` + where + returning
	return sql, append([]any{id, string(m.to), phaseNames(m.from)}, args...)
}

func phaseNames(ps []phase) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = string(p)
	}
	return out
}

// intentState is where a submission intent is (pep.intents.state): written
// and maybe submitted (intent); its handle persisted (bound); its task ended
// before binding, so a request made under its key must be found and
// cancelled (abandoned); settled with nothing left at the backend (failed).
type intentState string

const (
	intentOpen      intentState = "intent"
	intentBound     intentState = "bound"
	intentAbandoned intentState = "abandoned"
	intentFailed    intentState = "failed"
)

var allIntentStates = []intentState{intentOpen, intentBound, intentAbandoned, intentFailed}

// intentTransitions lists every allowed intent state change.
var intentTransitions = map[intentState][]intentState{
	intentOpen:      {intentBound, intentAbandoned, intentFailed},
	intentAbandoned: {intentBound, intentFailed},
}

// An intentMove is one intent state transition, as an UPDATE applies it.
type intentMove struct {
	from []intentState
	to   intentState
}

// The intent moves; each is a listed transition (TestTransitions).
var (
	intentBind    = intentMove{[]intentState{intentOpen, intentAbandoned}, intentBound} // its handle is bound (by any binder)
	intentRefused = intentMove{[]intentState{intentOpen}, intentFailed}                 // the backend refused it: nothing exists
	intentAbandon = intentMove{[]intentState{intentOpen}, intentAbandoned}              // its fate unknown, its task failed
	intentSettled = intentMove{[]intentState{intentAbandoned}, intentFailed}            // what it made is cancelled, or it made nothing
	intentMoves   = []intentMove{intentBind, intentRefused, intentAbandon, intentSettled}
)

// canMoveIntent reports whether an intent may go from state from to to.
func canMoveIntent(from, to intentState) bool { return slices.Contains(intentTransitions[from], to) }

// apply runs m on intent key as one conditional UPDATE ($1 key, $2 the new
// state, $3 the states it may leave; set's parameters from $4). It is the
// only statement that writes an intent's state.
func (m intentMove) apply(ctx context.Context, q querier, key, set string, args ...any) error {
	sql, args := m.statement(key, set, args...)
	_, err := q.Exec(ctx, sql, args...)
	return err
}

// statement is the UPDATE apply runs, with its arguments. A move to a
// settled state (bound, failed) drops the sealed submission body: only open
// and abandoned intents are ever submitted, so it is never read again.
func (m intentMove) statement(key, set string, args ...any) (string, []any) {
	from := make([]string, len(m.from))
	for i, s := range m.from {
		from[i] = string(s)
	}
	if len(intentTransitions[m.to]) == 0 {
		set += `, body_sealed = NULL`
	}
	return `UPDATE pep.intents SET state = $2, updated_at = now()` + set + ` WHERE key = $1 AND state = ANY($3)`,
		append([]any{key, string(m.to), from}, args...)
}

// querier runs statements; pools and transactions both do.
type querier interface {
	tasks.Querier
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// approvalTask is pep.approval_tasks.
type approvalTask struct {
	TaskID      string
	Tool        string
	ArgsSealed  []byte
	ArgsDigest  string
	Principal   string // Principal.Key of the caller the task is for
	Phase       phase
	Generation  int
	BackendID   *string
	StatusURL   *string
	CancelURL   *string
	Deadline    *time.Time
	Chained     int
	InputSchema map[string]any
	ClaimedAt   *time.Time
	ExecDL      *time.Time
	CreatedAt   time.Time
	// The identity of the tool the call was approved for (migrations/pep
	// 0005); nil on a task opened before it was recorded.
	ToolDigest, Upstream, UpstreamTool *string
	// TraceParent is the trace context of the tools/call that opened the
	// task (migrations/pep 0007); nil when it was not traced.
	TraceParent *string
	// LookAt is when the task is next looked at (migrations/pep 0008);
	// nil when nothing is scheduled.
	LookAt *time.Time
	// Deferred tasks (approval tools, interim.go) run when their caller
	// repeats the call, not when approved; ApprovedUntil is the approval
	// the current generation holds meanwhile (migrations/pep 0013).
	Deferred      bool
	ApprovedUntil *time.Time
}

const approvalColumns = `task_id, tool, args_sealed, args_digest, principal, phase, generation, backend_id, status_url, cancel_url,
	deadline, chained, input_schema, claimed_at, exec_deadline, created_at, tool_digest, upstream, upstream_tool, trace_parent, look_at,
	deferred, approved_until`

func scanApproval(row pgx.Row) (*approvalTask, error) {
	var a approvalTask
	err := row.Scan(&a.TaskID, &a.Tool, &a.ArgsSealed, &a.ArgsDigest, &a.Principal, &a.Phase, &a.Generation, &a.BackendID,
		&a.StatusURL, &a.CancelURL, &a.Deadline, &a.Chained, &a.InputSchema, &a.ClaimedAt, &a.ExecDL, &a.CreatedAt,
		&a.ToolDigest, &a.Upstream, &a.UpstreamTool, &a.TraceParent, &a.LookAt, &a.Deferred, &a.ApprovedUntil)
	return &a, err
}

// getApproval reads approval task id; tasks.ErrNotFound if there is none.
func getApproval(ctx context.Context, q tasks.Querier, id string) (*approvalTask, error) {
	a, err := scanApproval(q.QueryRow(ctx, `SELECT `+approvalColumns+` FROM pep.approval_tasks WHERE task_id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, tasks.ErrNotFound
	}
	return a, err
}

// RequestOf is the backend request approval task id waits on now ("" if
// none), for tools outside the gate that drive the backend's side of a
// task (arapbench decides it through the decision API).
func RequestOf(ctx context.Context, q tasks.Querier, id string) (string, error) {
	var backendID *string
	err := q.QueryRow(ctx, `SELECT backend_id FROM pep.approval_tasks WHERE task_id = $1`, id).Scan(&backendID)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", tasks.ErrNotFound
	}
	if err != nil || backendID == nil {
		return "", err
	}
	return *backendID, nil
}

// intent is pep.intents.
type intent struct {
	Key, TaskID, SubmitURL string
	State                  intentState
	Generation             int
	Body                   []byte // the submission body, opened
}

// getIntent reads intent key with its sealed body.
func getIntent(ctx context.Context, q tasks.Querier, key string) (*intent, []byte, error) {
	var in intent
	var sealed []byte
	err := q.QueryRow(ctx, `SELECT key, task_id, generation, submit_url, body_sealed, state FROM pep.intents WHERE key = $1`, key).
		Scan(&in.Key, &in.TaskID, &in.Generation, &in.SubmitURL, &sealed, &in.State)
	return &in, sealed, err
}

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
