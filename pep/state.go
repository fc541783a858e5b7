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
// them is here or in the files beside it (stateopen.go, statemove.go,
// statesweep.go), and nowhere else (TestOneOwnerPerTable). Here are the
// phases and intent states, their moves, and the reads of a task and an
// intent. An approval task's phase and an intent's state change only by a
// move: one conditional UPDATE from the states it names to one listed
// transition (TestTransitions enumerates them). The callers (open, advance,
// execute, end, the Kind) compose these statements with the task store and
// the audit trail in their own transactions.

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
