package tasks

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNotFound means there is no such task, or not for this caller: the two
// are indistinguishable on purpose.
var ErrNotFound = errors.New("tasks: no such task")

// ConflictError says a transition was refused and what the task is now.
type ConflictError struct {
	ID      string
	Current Status
	To      Status
}

func (e *ConflictError) Error() string {
	if e.Current == "" { // not read (QueueTransition)
		return fmt.Sprintf("tasks: task %s cannot become %s from its status", e.ID, e.To)
	}
	return fmt.Sprintf("tasks: task %s is %s and cannot become %s", e.ID, e.Current, e.To)
}

// Store keeps tasks in pep.tasks.
type Store struct {
	DB  *pgxpool.Pool
	Now func() time.Time
}

func (s *Store) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC().Truncate(time.Microsecond)
	}
	return time.Now().UTC().Truncate(time.Microsecond)
}

// NewID returns a fresh, unguessable task id.
func NewID() string { return "tsk_" + rand.Text() }

// Querier runs single-row queries; pools and transactions both do.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

const columns = `id, principal, kind, status, status_message, input_requests, answered_keys, result, error, meta,
	created_at, updated_at, ttl_ms, poll_interval_ms, terminal_at`

func scan(row pgx.Row) (*Task, error) {
	var t Task
	err := row.Scan(&t.ID, &t.Principal, &t.Kind, &t.Status, &t.StatusMessage, &t.InputRequests, &t.AnsweredKeys,
		&t.Result, &t.Error, &t.Meta, &t.CreatedAt, &t.UpdatedAt, &t.TTLMs, &t.PollIntervalMs, &t.TerminalAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	return &t, err
}

// CreateTx inserts t (status working unless set) in tx. CreatedAt and
// UpdatedAt default to now.
func (s *Store) CreateTx(ctx context.Context, tx pgx.Tx, t *Task) error {
	s.defaults(t)
	_, err := tx.Exec(ctx, createSQL, t.createArgs()...)
	if err != nil {
		return fmt.Errorf("tasks: create: %w", err)
	}
	return nil
}

// defaults fills what CreateTx leaves to the store.
func (s *Store) defaults(t *Task) {
	if t.Status == "" {
		t.Status = Working
	}
	if t.CreatedAt.IsZero() {
		t.CreatedAt = s.now()
	}
	t.UpdatedAt = t.CreatedAt
	if t.AnsweredKeys == nil {
		t.AnsweredKeys = []string{}
	}
}

// QueueCreate is CreateTx queued on b (sent in a transaction), without
// CreateTx's announcement on Channel: for a task whose id no one holds
// until a later commit of its creator (the gate returns it only once the
// approval request is bound), so no listen stream can be waiting for it,
// and a stream that subscribes later reads it first. A notification in a
// writing transaction serializes commits: PostgreSQL holds a global lock
// from the notify queue's insertion through the commit's WAL flush, so
// notifying commits stop sharing flushes (docs/performance.md, "gate").
func (s *Store) QueueCreate(b *pgx.Batch, t *Task) {
	s.defaults(t)
	b.Queue(insertSQL, t.createArgs()[:13]...)
}

const insertSQL = `INSERT INTO pep.tasks (id, principal, kind, status, status_message, input_requests, answered_keys,
		result, error, meta, created_at, updated_at, ttl_ms, poll_interval_ms)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $11, $12, $13)`

// Every change is announced on Channel in its own transaction: listen
// streams learn of it when it commits, not by polling.
const createSQL = `WITH t AS (` + insertSQL + ` RETURNING id)
		SELECT pg_notify($14, id) FROM t`

func (t *Task) createArgs() []any {
	return []any{t.ID, t.Principal, t.Kind, t.Status, t.StatusMessage, nilMap(t.InputRequests), t.AnswerKeys(), nilRaw(t.Result), t.Error,
		nilMap(t.Meta), t.CreatedAt, t.TTLMs, t.PollIntervalMs, Channel}
}

// AnswerKeys returns the answered keys, never nil.
func (t *Task) AnswerKeys() []string {
	if t.AnsweredKeys == nil {
		return []string{}
	}
	return t.AnsweredKeys
}

func nilMap(m map[string]any) any {
	if m == nil {
		return nil
	}
	return m
}

func nilRaw(r json.RawMessage) any {
	if r == nil {
		return nil
	}
	return r
}

// Get returns task id.
func (s *Store) Get(ctx context.Context, q Querier, id string) (*Task, error) {
	return scan(q.QueryRow(ctx, `SELECT `+columns+` FROM pep.tasks WHERE id = $1`, id))
}

// GetFor returns task id if principal owns it; ErrNotFound otherwise.
func (s *Store) GetFor(ctx context.Context, id, principal string) (*Task, error) {
	t, err := s.Get(ctx, s.DB, id)
	if err != nil {
		return nil, err
	}
	if principal == "" || t.Principal != principal {
		return nil, ErrNotFound
	}
	return t, nil
}

// GetMany returns the tasks among ids that exist, by id.
func (s *Store) GetMany(ctx context.Context, ids []string) (map[string]*Task, error) {
	rows, err := s.DB.Query(ctx, `SELECT `+columns+` FROM pep.tasks WHERE id = ANY($1)`, ids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]*Task{}
	for rows.Next() {
		t, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out[t.ID] = t
	}
	return out, rows.Err()
}

// Owned returns those of ids that principal owns, in their order, each
// once, at most limit of them.
func (s *Store) Owned(ctx context.Context, principal string, ids []string, limit int) ([]string, error) {
	out := []string{}
	if principal == "" {
		return out, nil
	}
	mine := map[string]bool{}
	rows, err := s.DB.Query(ctx, `SELECT id FROM pep.tasks WHERE id = ANY($1) AND principal = $2`, ids, principal)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		mine[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, id := range ids {
		if mine[id] && len(out) < limit {
			out = append(out, id)
			delete(mine, id)
		}
	}
	return out, nil
}

// Change is a status change.
type Change struct {
	To            Status
	StatusMessage string
	// InputRequests replace the outstanding requests (to input_required).
	InputRequests map[string]any
	// Answered are keys now answered (input_required to working).
	Answered []string
	Result   json.RawMessage // to completed
	Error    *Error          // to failed
	// Meta is the task's _meta in its new state; terminal states keep none.
	Meta map[string]any
	// KeepUntil, when set, raises the TTL to keep the task readable at
	// least until then (an unlimited TTL stays unlimited).
	KeepUntil time.Time
	// From, when set, narrows the states the change may start from.
	From []Status
}

// TransitionTx applies c to task id in one conditional UPDATE and returns
// the task as it now is. A change the state machine does not allow from
// the current state changes nothing and returns a *ConflictError.
func (s *Store) TransitionTx(ctx context.Context, tx pgx.Tx, id string, c Change) (*Task, error) {
	sql, args := s.transition(id, c)
	t, err := scan(tx.QueryRow(ctx, sql, args...))
	if errors.Is(err, ErrNotFound) {
		cur, gerr := s.Get(ctx, tx, id)
		if gerr != nil {
			return nil, gerr
		}
		return nil, &ConflictError{ID: id, Current: cur.Status, To: c.To}
	}
	if err != nil {
		return nil, fmt.Errorf("tasks: transition %s to %s: %w", id, c.To, err)
	}
	return t, nil
}

// QueueTransition is TransitionTx queued on b (sent in a transaction): the
// task as it then is goes to *into when b's results are read. A change
// the state machine does not allow is a *ConflictError that does not say
// the current status.
func (s *Store) QueueTransition(b *pgx.Batch, id string, c Change, into **Task) {
	sql, args := s.transition(id, c)
	b.Queue(sql, args...).QueryRow(func(row pgx.Row) error {
		t, err := scan(row)
		switch {
		case errors.Is(err, ErrNotFound):
			return &ConflictError{ID: id, To: c.To}
		case err != nil:
			return fmt.Errorf("tasks: transition %s to %s: %w", id, c.To, err)
		}
		*into = t
		return nil
	})
}

// transition is the one conditional UPDATE of TransitionTx, announced on
// Channel.
func (s *Store) transition(id string, c Change) (string, []any) {
	var from []string
	for _, st := range AllStatuses {
		if CanTransition(st, c.To) && (c.From == nil || slices.Contains(c.From, st)) {
			from = append(from, string(st))
		}
	}
	if c.To == Working || c.To == InputRequired {
		from = append(from, string(c.To)) // a non-terminal state may be refreshed
	}
	now := s.now()
	var keep *time.Time
	if !c.KeepUntil.IsZero() {
		keep = &c.KeepUntil
	}
	var terminal *time.Time
	meta := c.Meta
	if c.To.Terminal() {
		terminal, meta = &now, nil
	}
	return `WITH t AS (UPDATE pep.tasks SET status = $2, status_message = $3,
			input_requests = $4, answered_keys = answered_keys || $5::text[], result = $6, error = $7, meta = $8,
			updated_at = $9, terminal_at = $10,
			ttl_ms = CASE WHEN $11::timestamptz IS NULL OR ttl_ms IS NULL THEN ttl_ms ELSE greatest(ttl_ms, ` + ttlUntil("$11") + `) END
		WHERE id = $1 AND status = ANY($12)
		RETURNING ` + columns + `)
		SELECT t.* FROM t, pg_notify($13, t.id) n`,
		[]any{id, c.To, c.StatusMessage, nilMap(c.InputRequests), orEmpty(c.Answered), nilRaw(c.Result), c.Error, nilMap(meta),
			now, terminal, keep, from, Channel}
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// KeepUntilTx raises task id's TTL so that it is kept at least until until
// (never lowers it; an unlimited TTL stays unlimited).
func (s *Store) KeepUntilTx(ctx context.Context, tx pgx.Tx, id string, until time.Time) error {
	_, err := s.KeepTx(ctx, tx, id, until)
	return err
}

// KeepTx is KeepUntilTx returning the task as it is then (nil if there is
// none), so a caller that returns it needs no second read. greatest()
// ignores NULL, hence the CASE that keeps an unlimited TTL unlimited.
func (s *Store) KeepTx(ctx context.Context, tx pgx.Tx, id string, until time.Time) (*Task, error) {
	t, err := scan(tx.QueryRow(ctx, keepSQL, id, until))
	return keptTask(id, t, err)
}

// QueueKeep is KeepTx queued on b (sent in a transaction): the task as it
// is then goes to *into (nil if there is none) when b's results are read.
func (s *Store) QueueKeep(b *pgx.Batch, id string, until time.Time, into **Task) {
	b.Queue(keepSQL, id, until).QueryRow(func(row pgx.Row) error {
		t, err := scan(row)
		*into, err = keptTask(id, t, err)
		return err
	})
}

var keepSQL = `UPDATE pep.tasks SET ttl_ms = CASE WHEN ttl_ms IS NULL THEN NULL ELSE greatest(ttl_ms, ` + ttlUntil("$2") + `) END
		WHERE id = $1 RETURNING ` + columns

func keptTask(id string, t *Task, err error) (*Task, error) {
	switch {
	case errors.Is(err, ErrNotFound):
		return nil, nil // as KeepUntilTx: nothing to keep
	case err != nil:
		return nil, fmt.Errorf("tasks: keep %s: %w", id, err)
	}
	return t, nil
}

// ttlUntil is TTLUntil in SQL: the ttl_ms that keeps a row until the
// timestamp in parameter p (whole milliseconds, truncated as TTLUntil does).
func ttlUntil(p string) string {
	return `trunc(extract(epoch FROM ` + p + `::timestamptz - created_at) * 1000)::bigint`
}

// TTLUntil is the ttlMs that keeps a task created at created until until.
func TTLUntil(created, until time.Time) int64 {
	return until.Sub(created).Milliseconds()
}

// CountByStatus counts the stored tasks (terminal ones until purged) by
// status, every status present, for the front-end's metrics.
func (s *Store) CountByStatus(ctx context.Context) (map[Status]int64, error) {
	counts := make(map[Status]int64, len(AllStatuses))
	for _, st := range AllStatuses {
		counts[st] = 0
	}
	rows, err := s.DB.Query(ctx, `SELECT status, count(*) FROM pep.tasks GROUP BY status`)
	if err != nil {
		return nil, fmt.Errorf("tasks: count by status: %w", err)
	}
	var st Status
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&st, &n}, func() error { counts[st] = n; return nil }); err != nil {
		return nil, fmt.Errorf("tasks: count by status: %w", err)
	}
	return counts, nil
}

// Purge deletes terminal tasks whose TTL has elapsed. Non-terminal tasks are
// never purged here: their kind decides when they end.
func (s *Store) Purge(ctx context.Context) (int64, error) {
	tag, err := s.DB.Exec(ctx, `DELETE FROM pep.tasks WHERE terminal_at IS NOT NULL AND ttl_ms IS NOT NULL
		AND created_at + ttl_ms * interval '1 millisecond' < $1`, s.now())
	if err != nil {
		return 0, fmt.Errorf("tasks: purge: %w", err)
	}
	return tag.RowsAffected(), nil
}
