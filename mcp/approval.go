package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/riverqueue/river"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/fault"
	"github.com/omcp/arap/internal/schemamsg"
	"github.com/omcp/arap/mcp/tasks"
)

// Phases of an approval task (pep.approval_tasks.phase). The wire status
// (tasks) is working through submitting, pending and claimed; input while
// it asks for input in-task; done ends with the task's terminal status.
const (
	phaseSubmitting = "submitting" // intent written; handle not yet bound
	phasePending    = "pending"    // waiting for the backend's decision
	phaseInput      = "input"      // waiting for in-task input to open a new request
	phaseClaimed    = "claimed"    // execution claimed: the tool runs at most once
	phaseDone       = "done"
)

// approvalTask is pep.approval_tasks.
type approvalTask struct {
	TaskID      string
	Tool        string
	ArgsSealed  []byte
	ArgsDigest  string
	Principal   string
	Phase       string
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
}

const approvalColumns = `task_id, tool, args_sealed, args_digest, principal, phase, generation, backend_id, status_url, cancel_url,
	deadline, chained, input_schema, claimed_at, exec_deadline, created_at`

func scanApproval(row pgx.Row) (*approvalTask, error) {
	var a approvalTask
	err := row.Scan(&a.TaskID, &a.Tool, &a.ArgsSealed, &a.ArgsDigest, &a.Principal, &a.Phase, &a.Generation, &a.BackendID,
		&a.StatusURL, &a.CancelURL, &a.Deadline, &a.Chained, &a.InputSchema, &a.ClaimedAt, &a.ExecDL, &a.CreatedAt)
	return &a, err
}

func (g *Gate) loadApproval(ctx context.Context, q tasks.Querier, id string) (*approvalTask, error) {
	a, err := scanApproval(q.QueryRow(ctx, `SELECT `+approvalColumns+` FROM pep.approval_tasks WHERE task_id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, tasks.ErrNotFound
	}
	return a, err
}

// binding opens the sealed call binding and checks it against its digest.
func (g *Gate) binding(a *approvalTask) (binding, error) {
	var b binding
	plain, err := g.box.Open(a.ArgsSealed, a.TaskID)
	if err != nil {
		return b, fmt.Errorf("mcp: task %s: call binding does not open: %w", a.TaskID, err)
	}
	if err := json.Unmarshal(plain, &b); err != nil {
		return b, err
	}
	d, err := digest(b.Tool, b.Args)
	if err != nil {
		return b, err
	}
	if d != a.ArgsDigest || b.Tool != a.Tool || b.Principal.Key() != a.Principal {
		return b, fmt.Errorf("mcp: task %s: call binding does not match its digest", a.TaskID)
	}
	return b, nil
}

// pendingMeta is the task _meta while the decision is out: the SEP-2643
// envelope with a task hint, repeated on every tasks/get until terminal.
func pendingMeta() map[string]any {
	switch {
	case brokenBuild && broken(violatePendingWithoutEnvelope):
		return nil
	case brokenBuild && broken(violateAuthorizationContextID):
		return map[string]any{MetaAuthorization: map[string]any{"reason": ReasonInsufficientAuthorization, "remediation": RemediationAvailable,
			"remediationHints": []any{map[string]any{"type": "task"}}, "authorizationContextId": "ctx_1"}}
	}
	return map[string]any{MetaAuthorization: envelope(RemediationAvailable, true)}
}

// submission is the ARAP access request body for a denial.
func (g *Gate) submission(p Principal, tool string, args map[string]any, decision authzen.Decision, hint *authzen.AccessRequestHint, extra map[string]any, taskID string) ([]byte, error) {
	ev := evaluation(p, tool, args)
	denial := map[string]any{"expires_at": hint.ExpiresAt.UTC().Format(time.RFC3339), "binding_token": hint.BindingToken}
	for _, k := range []string{authzen.CtxEvaluationID, authzen.CtxEvaluatedAt, authzen.CtxReason} {
		if v, ok := decision.Context[k]; ok {
			denial[k] = v
		}
	}
	if hint.Template != "" {
		denial["template"] = hint.Template
	}
	body := map[string]any{
		"subject": ev.Subject, "resource": ev.Resource, "action": ev.Action, "denial": denial,
		"client": map[string]any{"name": "arap MCP front-end", "actor": map[string]any{"id": p.ActorID, "type": "ai_agent"},
			"source": map[string]any{"integration_id": "mcp:" + tool}},
	}
	if p.ActorID == "" {
		delete(body["client"].(map[string]any), "actor")
	}
	if len(extra) > 0 {
		body["context"] = extra
	}
	if g.cfg.CallbackURL != "" {
		body["callback"] = map[string]any{"endpoint": g.cfg.CallbackURL, "state": taskID}
	}
	return json.Marshal(body)
}

// lockLimits is the class (first key) of the transaction-scoped advisory
// lock that serializes one principal's task openings (second key: hashtext
// of the principal), so the limits are counted and taken in one step. Two
// principals whose hashes collide only wait for each other.
const lockLimits = 0x70657031 // "pep1"

// errDuplicate means a live task for the same call exists.
var errDuplicate = errors.New("mcp: an identical call has a live task")

// open makes the approval task for a requestable denial, crash-consistently:
// (1) in one transaction, under the principal's limit lock, the dedup check,
// the limits, and the task, its sealed call binding and a submission intent
// with a fresh idempotency key and the exact body; (2) the backend
// submission under that key; (3) in one transaction, the returned handle,
// bound to the task. Only then is the task returned. A crash between any two
// steps is repaired by Reconcile, which resubmits the intent (the key makes
// the backend return the same handle) and binds it, or cancels it if the task
// ended meanwhile. A repeated call (same principal, tool and arguments)
// while the task is live returns the same task, whatever the limits; a call
// over a limit returns a *limitError and nothing is written or submitted.
func (g *Gate) open(ctx context.Context, p Principal, tool string, args map[string]any, decision authzen.Decision, hint *authzen.AccessRequestHint, extra map[string]any) (*tasks.Task, error) {
	d, err := digest(tool, args)
	if err != nil {
		return nil, err
	}
	dedup := dedupKey(p, tool, d)
	for range 3 {
		o, err := g.insert(ctx, p, tool, args, d, dedup, decision, hint, extra)
		var pgErr *pgconn.PgError
		if errors.Is(err, errDuplicate) || errors.As(err, &pgErr) && pgErr.Code == "23505" {
			// A concurrent duplicate won; should its task have ended
			// since, try again.
			if t, err := g.existing(ctx, dedup); t != nil || err != nil {
				return t, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		fault.Point("pep.after-intent")
		if err := g.submitAndBind(ctx, o.key); err != nil {
			return nil, err
		}
		return g.tasks.Get(ctx, g.cfg.DB, o.task)
	}
	return nil, rpcError(tasks.CodeInternalError, "an identical call is changing state; retry shortly")
}

// opened names a task written by insert and its submission intent's key.
type opened struct{ task, key string }

// insert is step (1) of open.
func (g *Gate) insert(ctx context.Context, p Principal, tool string, args map[string]any, d, dedup string, decision authzen.Decision, hint *authzen.AccessRequestHint, extra map[string]any) (opened, error) {
	taskID, key := tasks.NewID(), newKey()
	if brokenBuild && broken(violateClockTaskIDs) {
		taskID = fmt.Sprintf("tsk_%d", time.Now().UnixNano())
	}
	body, err := g.submission(p, tool, args, decision, hint, extra, taskID)
	if err != nil {
		return opened{}, err
	}
	plainBinding, err := json.Marshal(binding{Tool: tool, Args: args, Principal: p})
	if err != nil {
		return opened{}, err
	}
	submitURL := hint.Endpoint
	if submitURL == "" {
		submitURL = strings.TrimRight(g.cfg.Backend.BaseURL, "/") + authzen.PathRequests
	}
	now := g.now()
	ttl := tasks.TTLUntil(now, hint.ExpiresAt.Add(g.cfg.ResultRetention)) // provisional: extended when bound
	err = pgx.BeginFunc(ctx, g.cfg.DB, func(tx pgx.Tx) error {
		// The lock is its own statement: each statement after it reads a
		// snapshot taken once every earlier holder has committed.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, lockLimits, p.Key()); err != nil {
			return err
		}
		var live bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pep.approval_tasks WHERE dedup_key = $1 AND phase <> 'done')`, dedup).Scan(&live); err != nil {
			return err
		}
		if live {
			return errDuplicate
		}
		if msg, err := g.limited(ctx, tx, p); err != nil || msg != "" {
			if err == nil {
				err = &limitError{msg: msg}
			}
			return err
		}
		if err := g.tasks.CreateTx(ctx, tx, &tasks.Task{
			ID: taskID, Principal: p.Key(), Kind: KindApproval, Status: tasks.Working,
			StatusMessage: "Waiting for approval: " + describe(hint) + brokenStatusArgs(args), Meta: pendingMeta(), CreatedAt: now,
			TTLMs: &ttl, PollIntervalMs: int(g.cfg.PollInterval.Milliseconds()),
		}); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO pep.approval_tasks (task_id, tool, args_sealed, args_digest, principal, dedup_key, phase,
			generation, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, 'submitting', 1, $7, $7)`,
			taskID, tool, g.box.Seal(plainBinding, taskID), d, p.Key(), dedup, now); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO pep.intents (key, task_id, generation, submit_url, body_sealed, state, created_at, updated_at)
			VALUES ($1, $2, 1, $3, $4, 'intent', $5, $5)`, key, taskID, submitURL, g.box.Seal(body, key), now)
		return err
	})
	var le *limitError
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return opened{task: taskID, key: key}, nil
	case errors.Is(err, errDuplicate), errors.As(err, &le), errors.As(err, &pgErr) && pgErr.Code == "23505":
		return opened{}, err
	}
	return opened{}, fmt.Errorf("mcp: record intent: %w", err)
}

// existing returns the live approval task with dedup key, waiting (briefly)
// for its handle to be bound: a task is never returned before that.
func (g *Gate) existing(ctx context.Context, dedup string) (*tasks.Task, error) {
	deadline := time.Now().Add(15 * time.Second)
	for {
		var id, phase string
		live := `SELECT task_id, phase FROM pep.approval_tasks WHERE dedup_key = $1 AND phase <> 'done'`
		if brokenBuild && broken(violateTerminalReopened) { // the latest task for the call, ended or not
			live = `SELECT task_id, 'pending' FROM pep.approval_tasks WHERE dedup_key = $1 ORDER BY created_at DESC LIMIT 1`
		}
		err := g.cfg.DB.QueryRow(ctx, live, dedup).Scan(&id, &phase)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		if phase != phaseSubmitting {
			return g.tasks.Get(ctx, g.cfg.DB, id)
		}
		if time.Now().After(deadline) {
			return nil, rpcError(tasks.CodeInternalError, "an identical call is still being submitted for approval; retry shortly")
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// intent is pep.intents.
type intent struct {
	Key, TaskID, SubmitURL, State string
	Generation                    int
	Body                          []byte
}

func (g *Gate) loadIntent(ctx context.Context, key string) (*intent, error) {
	var in intent
	var sealed []byte
	err := g.cfg.DB.QueryRow(ctx, `SELECT key, task_id, generation, submit_url, body_sealed, state FROM pep.intents WHERE key = $1`, key).
		Scan(&in.Key, &in.TaskID, &in.Generation, &in.SubmitURL, &sealed, &in.State)
	if err != nil {
		return nil, err
	}
	if in.Body, err = g.box.Open(sealed, key); err != nil {
		return nil, err
	}
	return &in, nil
}

// errUncertain means the backend may or may not have the request.
var errUncertain = errors.New("submission outcome unknown")

// submit sends an intent. A 4xx problem is a definite refusal (nothing was
// created); anything else is uncertain and can only be settled by
// resubmitting the same key.
func (g *Gate) submit(ctx context.Context, in *intent) (authzen.TaskResponse, error) {
	var tr authzen.TaskResponse
	err := retryTransient(ctx, func() (err error) {
		tr, err = g.cfg.Backend.Submit(ctx, in.SubmitURL, in.Key, in.Body)
		return err
	})
	if err != nil && !refused(err) {
		return authzen.TaskResponse{}, fmt.Errorf("%w: %v", errUncertain, err)
	}
	return tr, err
}

// retryTransient runs op up to three times, a moment apart, until it
// succeeds or the backend refuses: a replica dying under a call, or a
// balancer without a healthy upstream for a moment, is not worth failing a
// tool call for. Only for operations that are safe to repeat: an
// evaluation, a submission under its Idempotency-Key.
func retryTransient(ctx context.Context, op func() error) error {
	var err error
	for attempt := range 3 {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return errors.Join(err, ctx.Err())
			case <-time.After(time.Duration(attempt*200) * time.Millisecond):
			}
		}
		if err = op(); err == nil || refused(err) {
			return err
		}
	}
	return err
}

// refused reports whether err is the backend's definite answer: a 4xx
// problem other than 429.
func refused(err error) bool {
	var pe *authzen.ProblemError
	return errors.As(err, &pe) && pe.Status >= 400 && pe.Status < 500 && pe.Status != 429
}

// submitAndBind submits intent key and binds the handle to its task.
func (g *Gate) submitAndBind(ctx context.Context, key string) error {
	in, err := g.loadIntent(ctx, key)
	if err != nil {
		return err
	}
	tr, err := g.submit(ctx, in)
	fault.Point("pep.after-submit")
	if err != nil {
		g.cfg.Log.Warn("approval request not submitted", "task_id", in.TaskID, "error", err.Error())
		if ferr := g.failIntent(ctx, in, !errors.Is(err, errUncertain), err); ferr != nil {
			return ferr
		}
		return rpcError(tasks.CodeInternalError, "the approval request could not be submitted; the tool did not run")
	}
	return g.bind(ctx, in, tr)
}

// failIntent ends a task whose request could not be made: failed (before any
// claim, so failed is allowed). An uncertain submission leaves the intent
// "abandoned", so Reconcile finds and cancels a request that may exist.
func (g *Gate) failIntent(ctx context.Context, in *intent, refused bool, cause error) error {
	state := "abandoned"
	if refused {
		state = "failed"
	}
	return pgx.BeginFunc(ctx, g.cfg.DB, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE pep.intents SET state = $2, updated_at = now() WHERE key = $1 AND state = 'intent'`, in.Key, state); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `UPDATE pep.approval_tasks SET phase = 'done', updated_at = now() WHERE task_id = $1 AND phase = 'submitting' AND generation = $2`,
			in.TaskID, in.Generation)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		why := "approval request could not be submitted: " + sanitize(cause.Error(), 200)
		t, err := g.tasks.TransitionTx(ctx, tx, in.TaskID, tasks.Change{To: tasks.Failed, StatusMessage: "The approval request could not be submitted; the tool did not run.",
			Error: &tasks.Error{Code: tasks.CodeInternalError, Message: why}, TTLMs: g.retainFrom(ctx, tx, in.TaskID)})
		if err != nil {
			return err
		}
		return g.audit(ctx, tx, in.TaskID, AuditFailed, actorPEP, *t.TerminalAt, map[string]any{"generation": in.Generation, "backend_request_id": nil, "error": why})
	})
}

// retainFrom is the ttlMs that keeps a task until now + result retention.
func (g *Gate) retainFrom(ctx context.Context, q tasks.Querier, id string) *int64 {
	var created time.Time
	if err := q.QueryRow(ctx, `SELECT created_at FROM pep.tasks WHERE id = $1`, id).Scan(&created); err != nil {
		return nil
	}
	ttl := tasks.TTLUntil(created, g.now().Add(g.cfg.ResultRetention))
	return &ttl
}

// extendTTL raises task id's TTL to keep it until at least until.
func (g *Gate) extendTTL(ctx context.Context, id string, until time.Time) error {
	return pgx.BeginFunc(ctx, g.cfg.DB, func(tx pgx.Tx) error {
		var created time.Time
		if err := tx.QueryRow(ctx, `SELECT created_at FROM pep.tasks WHERE id = $1`, id).Scan(&created); err != nil {
			return err
		}
		return g.tasks.ExtendTTLTx(ctx, tx, id, tasks.TTLUntil(created, until))
	})
}

// bind records the handle of intent in's request on its task, extends the
// TTL to the request's deadline plus retention, and schedules tracking. If
// the task ended before the handle arrived (cancelled), the request is
// cancelled instead.
func (g *Gate) bind(ctx context.Context, in *intent, tr authzen.TaskResponse) error {
	windowEnd := g.now().Add(g.cfg.MaxWindow)
	deadline := windowEnd
	if tr.Task.ExpiresAt != nil && tr.Task.ExpiresAt.Before(deadline) {
		deadline = *tr.Task.ExpiresAt
	}
	cancelURL, _ := tr.Task.Links["cancel"].(string)
	bound := false
	err := pgx.BeginFunc(ctx, g.cfg.DB, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE pep.intents SET state = 'bound', backend_id = $2, status_url = $3, cancel_url = $4, deadline = $5, updated_at = now()
			WHERE key = $1 AND state IN ('intent', 'abandoned')`, in.Key, tr.Task.ID, tr.Task.StatusEndpoint, cancelURL, deadline); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `UPDATE pep.approval_tasks SET phase = 'pending', backend_id = $3, status_url = $4, cancel_url = $5, deadline = $6,
			window_end = $7, updated_at = now()
			WHERE task_id = $1 AND phase = 'submitting' AND generation = $2`, in.TaskID, in.Generation, tr.Task.ID, tr.Task.StatusEndpoint, cancelURL, deadline, windowEnd)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			// Either another binder (the reconciler, or the submitter when
			// the reconciler lost) bound this same request first: it is the
			// task's and stays; or the task moved on (cancelled) without it:
			// cancel it below.
			var held *string
			err := tx.QueryRow(ctx, `SELECT backend_id FROM pep.approval_tasks WHERE task_id = $1 AND generation = $2`,
				in.TaskID, in.Generation).Scan(&held)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			bound = held != nil && *held == tr.Task.ID
			return nil
		}
		bound = true
		var created time.Time
		if err := tx.QueryRow(ctx, `SELECT created_at FROM pep.tasks WHERE id = $1`, in.TaskID).Scan(&created); err != nil {
			return err
		}
		if err := g.tasks.ExtendTTLTx(ctx, tx, in.TaskID, tasks.TTLUntil(created, deadline.Add(g.cfg.ResultRetention))); err != nil {
			return err
		}
		first := g.now().Add(g.undecidedPoll())
		if first.After(deadline.Add(time.Second)) {
			first = deadline.Add(time.Second) // the deadline ends it, if nothing else does
		}
		_, err = g.cfg.Jobs.InsertTx(ctx, tx, TrackArgs{TaskID: in.TaskID}, trackOpts(first))
		return err
	})
	if err != nil {
		return fmt.Errorf("mcp: bind handle: %w", err)
	}
	fault.Point("pep.after-handle")
	if !bound && cancelURL != "" {
		g.cancelBackend(ctx, cancelURL)
	}
	return nil
}

func trackOpts(at time.Time) *river.InsertOpts {
	return &river.InsertOpts{Queue: Queue, ScheduledAt: at, MaxAttempts: 1000}
}

// cancelBackend cancels a backend request, best effort (it expires anyway).
func (g *Gate) cancelBackend(ctx context.Context, cancelURL string) {
	if _, err := g.cfg.Backend.Cancel(ctx, cancelURL, "mcp_task_cancelled"); err != nil && !authzen.IsProblem(err, authzen.ProblemInvalidTaskState) {
		g.cfg.Log.Warn("backend cancel failed", "error", err.Error())
	}
}

// Advance moves approval task id forward: it reads the backend's status
// endpoint (authoritative; a callback only wakes us), and on approval
// re-evaluates with the approval and executes. It is safe to run several
// times concurrently (callback and poll): every step is a conditional update
// and the execution claim admits one winner. It returns when to look again
// (zero: nothing more to do).
func (g *Gate) Advance(ctx context.Context, id string) (time.Time, error) {
	a, err := g.loadApproval(ctx, g.cfg.DB, id)
	if errors.Is(err, tasks.ErrNotFound) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, err
	}
	switch a.Phase {
	case phaseClaimed:
		return g.reapClaim(ctx, a)
	case phasePending:
	default:
		return time.Time{}, nil
	}
	tr, retryAfter, err := g.cfg.Backend.Status(ctx, *a.StatusURL)
	if err != nil {
		if authzen.IsProblem(err, authzen.ProblemUnknownTask) || authzen.IsProblem(err, authzen.ProblemTaskExpired) {
			return time.Time{}, g.deny(ctx, a, "The approval request is no longer known to the approval service; the tool did not run.")
		}
		if a.Deadline != nil && g.now().After(a.Deadline.Add(time.Minute)) {
			return time.Time{}, g.fail(ctx, a, "the approval service was unreachable until the request's deadline passed")
		}
		g.cfg.Log.Warn("status read failed; will retry", "task_id", id, "error", err.Error())
		return g.backoff(a, 0), nil
	}
	if tr.Task.ID != *a.BackendID {
		return time.Time{}, nil // a stale generation's answer: ignored
	}
	switch tr.Task.Status {
	case authzen.StatusApproved:
		if tr.Result == nil || tr.Result.Mode != authzen.ModeReevaluate || tr.Result.Approval == nil {
			return time.Time{}, g.deny(ctx, a, "The approval came back in a form this server cannot enforce; the tool did not run.")
		}
		return g.reevaluate(ctx, a, tr.Result.Approval)
	case authzen.StatusDenied:
		if brokenBuild && broken(violateExecuteAfterDenial) {
			if b, err := g.binding(a); err == nil {
				_, _ = g.tools[a.Tool].Run(ctx, Invocation{DB: g.cfg.DB, TaskID: a.TaskID, Principal: b.Principal, Args: b.Args})
			}
		}
		return time.Time{}, g.deny(ctx, a, "The approval was denied; the tool did not run.")
	case authzen.StatusExpired:
		if brokenBuild && broken(violateExpiryUnexplained) {
			return time.Time{}, g.deny(ctx, a, "Not approved; the tool did not run.")
		}
		return time.Time{}, g.deny(ctx, a, "The approval request expired without a decision; the tool did not run.")
	case authzen.StatusCancelled:
		if brokenBuild && broken(violateBackendCancelIgnored) {
			return g.backoff(a, 0), nil
		}
		return time.Time{}, g.cancelLocal(ctx, a, "The approval request was cancelled at the approval service; the tool did not run.")
	case authzen.StatusFailed:
		return time.Time{}, g.fail(ctx, a, "the approval service could not complete the request")
	default: // pending, or a status we do not know: not approved
		if err := g.extendDeadline(ctx, a, tr.Task.ExpiresAt); err != nil {
			return time.Time{}, err
		}
		if a.Deadline != nil && g.now().After(*a.Deadline) {
			// Past the window this server accepts (MaxWindow): the backend
			// would wait longer, this task does not. The task ends first:
			// the cancel's own callback would otherwise find the request
			// cancelled and end the task as cancelled instead.
			if err := g.deny(ctx, a, "The approval was not decided within the time this server allows; the tool did not run."); err != nil {
				return time.Time{}, err
			}
			if a.CancelURL != nil && *a.CancelURL != "" {
				g.cancelBackend(ctx, *a.CancelURL)
			}
			return time.Time{}, nil
		}
		return g.backoff(a, max(retryAfter, g.undecidedPoll())), nil
	}
}

// extendDeadline learns a later deadline the backend reports for the task's
// current request while it is pending (an ARS may extend a request's
// expires_at): the task's deadline moves up to it, but never past the window
// this server accepts (window_end, from --max-window), and its TTL is
// extended to cover the new deadline plus result retention, so the task is
// not announced as gone while it may still be decided. Neither ever moves
// back: an earlier expires_at ends the request at the backend, which the
// status read then reports.
func (g *Gate) extendDeadline(ctx context.Context, a *approvalTask, expiresAt *time.Time) error {
	if expiresAt == nil || a.Deadline == nil || !expiresAt.After(*a.Deadline) {
		return nil
	}
	var deadline time.Time
	err := pgx.BeginFunc(ctx, g.cfg.DB, func(tx pgx.Tx) error {
		var created time.Time
		err := tx.QueryRow(ctx, `UPDATE pep.approval_tasks SET deadline = least($3::timestamptz, window_end), updated_at = now()
			WHERE task_id = $1 AND phase = 'pending' AND generation = $2 AND window_end IS NOT NULL -- least() would skip a NULL
				AND deadline < least($3::timestamptz, window_end)
			RETURNING deadline, (SELECT created_at FROM pep.tasks WHERE id = $1)`, a.TaskID, a.Generation, expiresAt.UTC()).Scan(&deadline, &created)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // already as late as allowed, or the task moved on
		}
		if err != nil {
			return err
		}
		return g.tasks.ExtendTTLTx(ctx, tx, a.TaskID, tasks.TTLUntil(created, deadline.Add(g.cfg.ResultRetention)))
	})
	if err != nil {
		return fmt.Errorf("mcp: task %s: extend deadline: %w", a.TaskID, err)
	}
	if !deadline.IsZero() {
		a.Deadline = &deadline
	}
	return nil
}

// SafetyPoll is how often an undecided request is read when the backend
// calls back: the callback wakes the task, so the poll only covers a
// callback that never came (the backend retries deliveries for hours).
// Polling at the client's pace instead would make the backend's status
// reads grow with the number of pending tasks (docs/performance.md, "gate").
const SafetyPoll = 30 * time.Second

// undecidedPoll is the least wait before reading an undecided request again.
func (g *Gate) undecidedPoll() time.Duration {
	if g.cfg.CallbackURL != "" {
		return SafetyPoll
	}
	return g.cfg.PollInterval
}

// backoff schedules the next status read: exponential from the poll
// interval to a minute, with jitter, never sooner than Retry-After, and
// no later than just past the task's deadline (which then ends it).
func (g *Gate) backoff(a *approvalTask, retryAfter time.Duration) time.Time {
	age := g.now().Sub(a.CreatedAt)
	wait := g.cfg.PollInterval
	for wait < age/4 && wait < time.Minute {
		wait *= 2
	}
	wait = min(wait, time.Minute)
	wait += time.Duration(rand.Float64() * 0.2 * float64(wait))
	next := g.now().Add(max(wait, retryAfter))
	if a.Deadline != nil && next.After(a.Deadline.Add(time.Second)) && g.now().Before(*a.Deadline) {
		next = a.Deadline.Add(time.Second)
	}
	return next
}

// reevaluate asks the PDP again with the approval as an input and acts on
// the answer (SEP-2848 "Completion").
func (g *Gate) reevaluate(ctx context.Context, a *approvalTask, approval *authzen.Approval) (time.Time, error) {
	b, err := g.binding(a)
	if err != nil {
		return time.Time{}, g.fail(ctx, a, "the stored call binding is damaged")
	}
	req := evaluation(b.Principal, b.Tool, b.Args)
	req.Context = authzen.Object{authzen.CtxApproval: approval}
	d, err := g.cfg.Backend.Evaluate(ctx, req)
	if err != nil {
		g.cfg.Log.Warn("re-evaluation failed; will retry", "task_id", a.TaskID, "error", err.Error())
		return g.backoff(a, 0), nil
	}
	if d.Decision {
		until := approval.ApprovedUntil
		if echo, ok := d.Context[authzen.CtxApproval].(map[string]any); ok {
			if s, ok := echo["approved_until"].(string); ok {
				if t, err := time.Parse(time.RFC3339, s); err == nil && t.Before(until) {
					until = t
				}
			}
		}
		return time.Time{}, g.execute(ctx, a, b, approval.ID, until)
	}
	next, _ := d.Context[authzen.CtxNextAction].(string)
	reason, _ := d.Context[authzen.CtxReason].(string)
	if next == "" {
		next = map[string]string{authzen.ReasonApprovalExpired: authzen.NextActionRequest, authzen.ReasonOutOfScope: authzen.NextActionRequest,
			authzen.ReasonGrantPending: authzen.NextActionRetry}[reason]
	}
	if brokenBuild && broken(violateExecuteAfterExpiry) && reason == authzen.ReasonApprovalExpired {
		return time.Time{}, g.execute(ctx, a, b, approval.ID, g.now().Add(time.Hour))
	}
	if brokenBuild && broken(violateRetryPastExpiry) && reason == authzen.ReasonApprovalExpired {
		return g.backoff(a, 0), nil // retried for ever on the expired approval
	}
	switch next {
	case authzen.NextActionRetry:
		if brokenBuild && broken(violateRetryAsDenial) {
			return time.Time{}, g.deny(ctx, a, "The approval cannot be used yet; the tool did not run.")
		}
		if !g.now().Before(approval.ApprovedUntil) {
			return time.Time{}, g.deny(ctx, a, "The approval expired before it could be used; the tool did not run.")
		}
		after := 0 * time.Second
		if n, ok := d.Context[authzen.CtxRetryAfter].(float64); ok && n > 0 {
			after = time.Duration(n) * time.Second
		}
		// The task waits for the grant while the approval lasts, which may
		// be past the request's deadline: it stays readable that long.
		if err := g.extendTTL(ctx, a.TaskID, approval.ApprovedUntil.Add(g.cfg.ResultRetention)); err != nil {
			return time.Time{}, err
		}
		// Retries stop once the approval expires (SEP-2848): a hint past
		// approved_until is cut to it, and that look finds it expired.
		next := g.backoff(a, after)
		if next.After(approval.ApprovedUntil) {
			next = approval.ApprovedUntil
		}
		return next, nil
	case authzen.NextActionRequest:
		if hint, ok := d.AccessRequest(); ok {
			return time.Time{}, g.chain(ctx, a, b, d, hint)
		}
	}
	return time.Time{}, g.deny(ctx, a, "After the approval, the policy still does not allow this call; the tool did not run.")
}

// execute claims the task and runs the tool, at most once. The claim is one
// compare-and-set (pending -> claimed, in the current generation, while the
// caller still has a live token), mutually exclusive with cancel and expiry,
// and records the claim in the audit trail in the same transaction. Every
// check holds at the claim: the approval not expired (at the claim's own
// time), the caller still valid (in the claim's statement), the binding
// intact (read before). A run once claimed is authorized: an approval that
// expires, or a token revoked, while the tool runs does not undo the claim,
// and the outcome is recorded as it is.
func (g *Gate) execute(ctx context.Context, a *approvalTask, b binding, approvalID string, approvedUntil time.Time) error {
	now := g.now()
	if !now.Before(approvedUntil) {
		return g.deny(ctx, a, "The approval expired before the tool could run; the tool did not run.")
	}
	tool, ok := g.tools[a.Tool]
	if !ok {
		return g.fail(ctx, a, "the tool is no longer offered")
	}
	execDeadline := now.Add(g.cfg.ExecTimeout)
	claimed := false
	err := pgx.BeginFunc(ctx, g.cfg.DB, func(tx pgx.Tx) error {
		var backendID *string
		err := tx.QueryRow(ctx, `UPDATE pep.approval_tasks t SET phase = 'claimed', claimed_at = $3, exec_deadline = $4, updated_at = $3
			WHERE task_id = $1 AND phase = 'pending' AND generation = $2
			AND EXISTS (SELECT 1 FROM pep.callers c WHERE c.revoked_at IS NULL AND `+callerKey+` = t.principal)
			RETURNING backend_id`, a.TaskID, a.Generation, now, execDeadline).Scan(&backendID)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // lost to cancel, expiry or another runner, or the caller is gone
		}
		if err != nil {
			return err
		}
		claimed = true
		var created time.Time
		if err := tx.QueryRow(ctx, `SELECT created_at FROM pep.tasks WHERE id = $1`, a.TaskID).Scan(&created); err != nil {
			return err
		}
		if err := g.tasks.ExtendTTLTx(ctx, tx, a.TaskID, tasks.TTLUntil(created, execDeadline.Add(g.cfg.ResultRetention))); err != nil {
			return err
		}
		return g.audit(ctx, tx, a.TaskID, AuditClaimed, actorPEP, now, map[string]any{
			"generation": a.Generation, "tool": a.Tool, "args_digest": a.ArgsDigest, "principal": a.Principal,
			"backend_request_id": backendID, "approval_id": approvalID, "approved_until": approvedUntil.UTC().Format(time.RFC3339Nano),
			"exec_deadline": execDeadline.UTC().Format(time.RFC3339Nano)})
	})
	if err != nil {
		return err
	}
	if !claimed {
		// Only a caller gone invalid is this call's to act on: it ends the
		// task (if it is still before the claim, in this generation).
		if ok, err := g.callers.Valid(ctx, a.Principal); err != nil || ok {
			return err
		}
		return g.deny(ctx, a, "The caller is no longer authorized; the tool did not run.")
	}
	fault.Point("pep.after-claim")
	runCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.ExecTimeout)
	args := b.Args
	if brokenBuild && broken(violateArgumentsTruncated) { // runs from a binding that lost an argument
		args = map[string]any{}
		for k, v := range b.Args {
			if k != "to" {
				args[k] = v
			}
		}
	}
	out, runErr := tool.Run(runCtx, Invocation{DB: g.cfg.DB, TaskID: a.TaskID, Principal: b.Principal, Args: args})
	cancel()
	if brokenBuild && broken(violateSecondExecution) && runErr == nil {
		_, _ = tool.Run(context.WithoutCancel(ctx), Invocation{DB: g.cfg.DB, TaskID: a.TaskID, Principal: b.Principal, Args: b.Args})
	}
	fault.Point("pep.after-invoke")
	var res *sdk.CallToolResult
	disposition := ApprovedExecuted
	if runErr != nil {
		disposition = ExecutionError
		res = &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{
			Text: "The tool ran after approval but failed, so it may have had side effects: " + sanitize(runErr.Error(), 200)}}}
		switch {
		case brokenBuild && broken(violateExecutionErrorSaysNotRun):
			res.Content = []sdk.Content{&sdk.TextContent{Text: "The tool did not run: " + sanitize(runErr.Error(), 200)}}
		case brokenBuild && broken(violateExecutionErrorAsSuccess):
			disposition = ApprovedExecuted
		}
	} else {
		res = &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "Approved; the tool ran once. " + out.Text}}}
		if brokenBuild && broken(violateBodySilentOnRun) {
			res.Content = []sdk.Content{&sdk.TextContent{Text: "Approved. See the structured content."}}
		}
		if out.Structured != nil {
			res.StructuredContent = out.Structured
		}
	}
	res.Meta = sdk.Meta{MetaDisposition: disposition}
	if brokenBuild && broken(violateNoDisposition) {
		res.Meta = nil
	}
	if brokenBuild && broken(violateEnvelopeOnExecuted) {
		res.Meta[MetaAuthorization] = envelope(RemediationUnavailable, false)
	}
	return g.finish(ctx, a, []string{phaseClaimed}, res, disposition, "The tool ran after approval.", AuditCompleted, nil)
}

// preClaim are the phases from which a task can still be denied, failed or
// cancelled: before the execution claim.
var preClaim = []string{phaseSubmitting, phasePending, phaseInput}

// finish completes approval task a with res, if it is still in one of the
// phases from and at the generation a was read at: a decision about an
// earlier request never ends the task after it has moved on to a new one.
// The audit event kind (with extra data) is written with it.
func (g *Gate) finish(ctx context.Context, a *approvalTask, from []string, res *sdk.CallToolResult, disposition, msg, kind string, extra map[string]any) error {
	raw, err := json.Marshal(res)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, g.cfg.DB, func(tx pgx.Tx) error {
		var backendID *string
		err := tx.QueryRow(ctx, `UPDATE pep.approval_tasks SET phase = 'done', disposition = $3, updated_at = now()
			WHERE task_id = $1 AND phase = ANY($2) AND generation = $4 RETURNING backend_id`, a.TaskID, from, disposition, a.Generation).Scan(&backendID)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		t, err := g.tasks.TransitionTx(ctx, tx, a.TaskID, tasks.Change{To: tasks.Completed, StatusMessage: msg, Result: raw, TTLMs: g.retainFrom(ctx, tx, a.TaskID)})
		if err != nil {
			return err
		}
		sum, err := resultDigest(raw)
		if err != nil {
			return err
		}
		data := map[string]any{"generation": a.Generation, "backend_request_id": backendID, "disposition": disposition, "result_digest": sum}
		for k, v := range extra {
			data[k] = v
		}
		return g.audit(ctx, tx, a.TaskID, kind, actorPEP, *t.TerminalAt, data)
	})
}

// deny completes the task as a terminal denial: it did not run, and is
// fenced against any later approval or callback.
func (g *Gate) deny(ctx context.Context, a *approvalTask, text string) error {
	res := &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: text}},
		Meta: sdk.Meta{MetaDisposition: DeniedNotExecuted, MetaAuthorization: envelope(RemediationUnavailable, false)}}
	switch {
	case brokenBuild && broken(violateDispositionDisagrees):
		res.Meta[MetaDisposition] = ApprovedExecuted
	case brokenBuild && broken(violateDenialWithoutEnvelope):
		delete(res.Meta, MetaAuthorization)
	case brokenBuild && broken(violateDenialSilentOnRun):
		res.Content = []sdk.Content{&sdk.TextContent{Text: "Not approved."}}
	}
	return g.finish(ctx, a, preClaim, res, DeniedNotExecuted, "Not approved; the tool did not run.", AuditDenied, map[string]any{"reason": text})
}

// fail ends a task before any claim with a JSON-RPC error (failed is only
// ever used before the claim, so a possible side effect is never hidden).
func (g *Gate) fail(ctx context.Context, a *approvalTask, why string) error {
	return pgx.BeginFunc(ctx, g.cfg.DB, func(tx pgx.Tx) error {
		var backendID *string
		err := tx.QueryRow(ctx, `UPDATE pep.approval_tasks SET phase = 'done', updated_at = now()
			WHERE task_id = $1 AND phase = ANY($2) AND generation = $3 RETURNING backend_id`, a.TaskID, preClaim, a.Generation).Scan(&backendID)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		t, err := g.tasks.TransitionTx(ctx, tx, a.TaskID, tasks.Change{To: tasks.Failed, StatusMessage: "The approval could not be completed; the tool did not run.",
			Error: &tasks.Error{Code: tasks.CodeInternalError, Message: why}, TTLMs: g.retainFrom(ctx, tx, a.TaskID)})
		if err != nil {
			return err
		}
		return g.audit(ctx, tx, a.TaskID, AuditFailed, actorPEP, *t.TerminalAt, map[string]any{"generation": a.Generation, "backend_request_id": backendID, "error": why})
	})
}

// cancelLocalWon moves a pre-claim task to cancelled on behalf of actor. It
// reports whether this call won.
func (g *Gate) cancelLocalWon(ctx context.Context, id, msg, actor string) (*approvalTask, bool, error) {
	var a *approvalTask
	err := pgx.BeginFunc(ctx, g.cfg.DB, func(tx pgx.Tx) error {
		var err error
		a, err = scanApproval(tx.QueryRow(ctx, `UPDATE pep.approval_tasks SET phase = 'done', updated_at = now()
			WHERE task_id = $1 AND phase = ANY($2) RETURNING `+approvalColumns, id, preClaim))
		if errors.Is(err, pgx.ErrNoRows) {
			a = nil
			return nil // claimed or ended already: the cancel is a no-op
		}
		if err != nil {
			return err
		}
		t, err := g.tasks.TransitionTx(ctx, tx, id, tasks.Change{To: tasks.Cancelled, StatusMessage: msg, TTLMs: g.retainFrom(ctx, tx, id)})
		if err != nil {
			return err
		}
		return g.audit(ctx, tx, id, AuditCancelled, actor, *t.TerminalAt, map[string]any{"generation": a.Generation, "backend_request_id": a.BackendID, "reason": msg})
	})
	return a, a != nil, err
}

func (g *Gate) cancelLocal(ctx context.Context, a *approvalTask, msg string) error {
	_, _, err := g.cancelLocalWon(ctx, a.TaskID, msg, actorPEP)
	return err
}

// reapClaim ends a claimed task whose execution deadline has passed without
// a recorded result: the tool may have run, so the outcome is unknown. It is
// never run again.
func (g *Gate) reapClaim(ctx context.Context, a *approvalTask) (time.Time, error) {
	if a.ExecDL == nil || g.now().Before(*a.ExecDL) {
		if a.ExecDL != nil {
			return *a.ExecDL, nil
		}
		return time.Time{}, nil
	}
	res := &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{
		Text: "The tool may have run: it was started after approval, but its outcome could not be confirmed. Do not retry automatically; check whether it took effect."}},
		Meta: sdk.Meta{MetaDisposition: OutcomeUnknown}}
	return time.Time{}, g.finish(ctx, a, []string{phaseClaimed}, res, OutcomeUnknown, "Outcome unknown: the tool may have run.", AuditOutcomeUnknown, nil)
}

// chain opens a new request for the same call when re-evaluation says the
// approval does not suffice (next_action request). The current generation is
// consumed first, atomically, so a late callback or poll for it can no
// longer act; the number of chained requests is bounded.
func (g *Gate) chain(ctx context.Context, a *approvalTask, b binding, d authzen.Decision, hint *authzen.AccessRequestHint) error {
	if a.Chained+1 >= g.cfg.MaxChained && !(brokenBuild && broken(violateChainUnbounded)) {
		return g.deny(ctx, a, "The approval did not cover this call and too many new approval requests were made for it; the tool did not run.")
	}
	var schema map[string]any
	if hint.RequestSchemaURL != "" {
		s, err := g.requestSchema(ctx, hint.RequestSchemaURL)
		if err != nil {
			return err
		}
		if _, required := contextFields(s); len(required) > 0 {
			schema = s
		}
	}
	if schema != nil {
		// The new request needs input the task does not have: ask in-task.
		form, _ := contextFields(schema)
		key := inputKeyPrefix + newKey()[4:14]
		return pgx.BeginFunc(ctx, g.cfg.DB, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `UPDATE pep.approval_tasks SET phase = 'input', generation = generation + 1, chained = chained + 1,
				backend_id = NULL, status_url = NULL, cancel_url = NULL, input_schema = $3, updated_at = now()
				WHERE task_id = $1 AND phase = 'pending' AND generation = $2`, a.TaskID, a.Generation, schema)
			if err != nil || tag.RowsAffected() == 0 {
				return err
			}
			_, err = g.tasks.TransitionTx(ctx, tx, a.TaskID, tasks.Change{To: tasks.InputRequired,
				StatusMessage: "A new approval is needed (" + describe(hint) + "); please provide the requested information.",
				InputRequests: map[string]any{key: map[string]any{"method": "elicitation/create", "params": map[string]any{
					"mode": "form", "message": "A new approval is needed: " + describe(hint) + ". Please provide the information the approvers need.",
					"requestedSchema": form}}},
				Meta: brokenInputMeta(map[string]any{MetaAuthorization: envelope(RemediationAvailable, false)})})
			return err
		})
	}
	return g.reopen(ctx, a, b, d, hint, nil, phasePending)
}

// reopen consumes generation a.Generation (from phase from) and submits a new
// request for the same binding under a new intent.
func (g *Gate) reopen(ctx context.Context, a *approvalTask, b binding, d authzen.Decision, hint *authzen.AccessRequestHint, extra map[string]any, from string) error {
	key := newKey()
	body, err := g.submission(b.Principal, b.Tool, b.Args, d, hint, extra, a.TaskID)
	if err != nil {
		return err
	}
	submitURL := hint.Endpoint
	if submitURL == "" {
		submitURL = strings.TrimRight(g.cfg.Backend.BaseURL, "/") + authzen.PathRequests
	}
	gen := a.Generation + 1
	chained := 1
	if from == phaseInput {
		gen, chained = a.Generation, 0 // chain already advanced the generation
	}
	moved := false
	err = pgx.BeginFunc(ctx, g.cfg.DB, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE pep.approval_tasks SET phase = 'submitting', generation = $4, chained = chained + $5,
			backend_id = NULL, status_url = NULL, cancel_url = NULL, input_schema = NULL, updated_at = now()
			WHERE task_id = $1 AND phase = $2 AND generation = $3`, a.TaskID, from, a.Generation, gen, chained)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		moved = true
		if _, err := tx.Exec(ctx, `INSERT INTO pep.intents (key, task_id, generation, submit_url, body_sealed, state, created_at, updated_at)
			VALUES ($1, $2, $3, $4, $5, 'intent', now(), now())`, key, a.TaskID, gen, submitURL, g.box.Seal(body, key)); err != nil {
			return err
		}
		_, err = g.tasks.TransitionTx(ctx, tx, a.TaskID, tasks.Change{To: tasks.Working,
			StatusMessage: "Waiting for a new approval: " + describe(hint), Meta: pendingMeta(), Answered: nil})
		return err
	})
	if err != nil || !moved {
		return err
	}
	fault.Point("pep.after-intent")
	err = g.submitAndBind(ctx, key)
	var rpc *jsonrpc.Error
	if errors.As(err, &rpc) {
		return nil // not submitted: submitAndBind has failed the task
	}
	return err
}

// Cancel implements tasks.Kind: the same compare-and-set as the claim, from
// a cancellable pre-claim phase to cancelled. If it wins, the tool can never
// run and the backend request is cancelled; if the claim won, it is a no-op.
func (g *Gate) Cancel(ctx context.Context, t *tasks.Task) error {
	if brokenBuild && broken(violateCancelIgnored) {
		return nil
	}
	if brokenBuild && broken(violateExecuteAfterCancel) { // reports cancelled, fences nothing, cancels no request
		return pgx.BeginFunc(ctx, g.cfg.DB, func(tx pgx.Tx) error {
			_, err := g.tasks.TransitionTx(ctx, tx, t.ID, tasks.Change{To: tasks.Cancelled, StatusMessage: "Cancelled by the client; the tool did not run."})
			return err
		})
	}
	a, won, err := g.cancelLocalWon(ctx, t.ID, "Cancelled by the client; the tool did not run.", t.Principal)
	if err != nil || !won {
		return err
	}
	if a.CancelURL != nil {
		g.cancelBackend(ctx, *a.CancelURL)
	}
	return nil
}

// Update implements tasks.Kind: answers to the in-task input a chained
// request needs. They are validated against the backend's request schema;
// then the call is evaluated afresh and the new request submitted.
func (g *Gate) Update(ctx context.Context, t *tasks.Task, responses map[string]json.RawMessage) error {
	a, err := g.loadApproval(ctx, g.cfg.DB, t.ID)
	if err != nil {
		return err
	}
	if a.Phase != phaseInput {
		return nil
	}
	var key string
	var raw json.RawMessage
	for k, v := range responses {
		key, raw = k, v
	}
	var ans struct {
		Action  string         `json:"action"`
		Content map[string]any `json:"content"`
	}
	if json.Unmarshal(raw, &ans) != nil {
		return &tasks.InputError{Msg: "inputResponses[" + key + "] must be an elicitation result"}
	}
	if ans.Action != "accept" {
		return g.deny(ctx, a, "The information needed for a new approval was declined; the tool did not run.")
	}
	if v := validateAnswers(a.InputSchema, ans.Content); len(v) > 0 {
		return &tasks.InputError{Msg: "the answer does not satisfy the request schema: " + schemamsg.Join(v)}
	}
	b, err := g.binding(a)
	if err != nil {
		return g.fail(ctx, a, "the stored call binding is damaged")
	}
	d, err := g.cfg.Backend.Evaluate(ctx, evaluation(b.Principal, b.Tool, b.Args))
	if err != nil {
		return err
	}
	hint, ok := d.AccessRequest()
	if d.Decision || !ok {
		return g.deny(ctx, a, "The policy changed while waiting for input; call the tool again. It did not run.")
	}
	if _, err := g.cfg.DB.Exec(ctx, `UPDATE pep.tasks SET answered_keys = answered_keys || $2::text[] WHERE id = $1`, t.ID, []string{key}); err != nil {
		return err
	}
	return g.reopen(ctx, a, b, d, hint, ans.Content, phaseInput)
}

var _ tasks.Kind = (*Gate)(nil)
