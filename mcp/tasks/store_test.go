package tasks_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/mcp/tasks"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func create(t *testing.T, s *tasks.Store, ttl *int64) *tasks.Task {
	t.Helper()
	ctx := context.Background()
	task := &tasks.Task{ID: tasks.NewID(), Principal: "user:alice|agent:demo", Kind: "k", TTLMs: ttl, PollIntervalMs: 1000}
	require.NoError(t, pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error { return s.CreateTx(ctx, tx, task) }))
	return task
}

func transition(s *tasks.Store, id string, c tasks.Change) (*tasks.Task, error) {
	var out *tasks.Task
	err := pgx.BeginFunc(context.Background(), s.DB, func(tx pgx.Tx) error {
		var err error
		out, err = s.TransitionTx(context.Background(), tx, id, c)
		return err
	})
	return out, err
}

// TestStateMachine enumerates every (from, to) pair: working and
// input_required alternate, either may end, and an ended task never changes.
func TestStateMachine(t *testing.T) {
	s := &tasks.Store{DB: dbtest.New(t)}
	for _, from := range tasks.AllStatuses {
		for _, to := range tasks.AllStatuses {
			t.Run(fmt.Sprintf("%s to %s", from, to), func(t *testing.T) {
				task := create(t, s, nil)
				if from != tasks.Working {
					_, err := transition(s, task.ID, tasks.Change{To: from, Result: json.RawMessage(`{}`), Error: &tasks.Error{Code: -32603, Message: "x"}})
					require.NoError(t, err)
				}
				_, err := transition(s, task.ID, tasks.Change{To: to, Result: json.RawMessage(`{}`), Error: &tasks.Error{Code: -32603, Message: "x"}})
				allowed := tasks.CanTransition(from, to) || (from == to && !from.Terminal())
				if allowed {
					require.NoError(t, err)
				} else {
					var ce *tasks.ConflictError
					require.ErrorAs(t, err, &ce)
					require.Equal(t, from, ce.Current)
				}
				got, err := s.Get(context.Background(), s.DB, task.ID)
				require.NoError(t, err)
				if allowed {
					require.Equal(t, to, got.Status)
				} else {
					require.Equal(t, from, got.Status, "a refused change changes nothing")
				}
			})
		}
	}
}

func TestAccessTTLAndPurge(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	clock := func() time.Time { return now }
	s := &tasks.Store{DB: dbtest.New(t), Now: clock}
	ttl := int64(60_000)
	task := create(t, s, &ttl)

	_, err := s.GetFor(ctx, task.ID, "user:mallory|agent:demo")
	require.ErrorIs(t, err, tasks.ErrNotFound, "another principal's task does not exist for them")
	_, err = s.GetFor(ctx, task.ID, "")
	require.ErrorIs(t, err, tasks.ErrNotFound)

	// TTL only grows.
	require.NoError(t, pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error { return s.KeepUntilTx(ctx, tx, task.ID, task.CreatedAt.Add(time.Second)) }))
	got, _ := s.Get(ctx, s.DB, task.ID)
	require.EqualValues(t, 60_000, *got.TTLMs)
	require.NoError(t, pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error { return s.KeepUntilTx(ctx, tx, task.ID, task.CreatedAt.Add(90*time.Second)) }))
	got, _ = s.Get(ctx, s.DB, task.ID)
	require.EqualValues(t, 90_000, *got.TTLMs)
	odd := task.CreatedAt.Add(100*time.Second + 1500*time.Microsecond)
	require.NoError(t, pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error { return s.KeepUntilTx(ctx, tx, task.ID, odd) }))
	got, _ = s.Get(ctx, s.DB, task.ID)
	require.Equal(t, tasks.TTLUntil(task.CreatedAt, odd), *got.TTLMs, "whole milliseconds, truncated as TTLUntil does")
	_, err = transition(s, task.ID, tasks.Change{To: tasks.Working, StatusMessage: "still", KeepUntil: task.CreatedAt.Add(2 * time.Minute), Meta: map[string]any{"k": "v"}})
	require.NoError(t, err)
	got, _ = s.Get(ctx, s.DB, task.ID)
	require.EqualValues(t, 120_000, *got.TTLMs)
	require.Equal(t, "v", got.Meta["k"])
	_, err = transition(s, task.ID, tasks.Change{To: tasks.Working, StatusMessage: "answered", Answered: []string{"q1"}})
	require.NoError(t, err)
	got, _ = s.Get(ctx, s.DB, task.ID)
	require.Equal(t, []string{"q1"}, got.AnsweredKeys)

	// A working task past its TTL is never purged; a terminal one is.
	now = now.Add(time.Hour)
	n, err := s.Purge(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	_, err = transition(s, task.ID, tasks.Change{To: tasks.Cancelled})
	require.NoError(t, err)
	got, _ = s.Get(ctx, s.DB, task.ID)
	require.Nil(t, got.Meta, "terminal tasks carry no pending _meta")
	require.NotNil(t, got.TerminalAt)
	n, err = s.Purge(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	_, err = s.Get(ctx, s.DB, task.ID)
	require.ErrorIs(t, err, tasks.ErrNotFound)

	// Unlimited TTL (null) is never purged.
	forever := create(t, s, nil)
	_, err = transition(s, forever.ID, tasks.Change{To: tasks.Completed, Result: json.RawMessage(`{"content":[]}`)})
	require.NoError(t, err)
	now = now.Add(1000 * time.Hour)
	n, err = s.Purge(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	d := forever
	d, _ = s.Get(ctx, s.DB, forever.ID)
	w, _ := json.Marshal(d.Wire())
	require.Contains(t, string(w), `"ttlMs":null`, "unlimited is null on the wire, not absent")
}

// TestCountByStatus counts each status, listing the empty ones as zero.
func TestCountByStatus(t *testing.T) {
	s := &tasks.Store{DB: dbtest.New(t)}
	ctx := context.Background()
	counts, err := s.CountByStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, map[tasks.Status]int64{tasks.Working: 0, tasks.InputRequired: 0, tasks.Completed: 0, tasks.Failed: 0, tasks.Cancelled: 0}, counts)
	for range 3 {
		create(t, s, nil)
	}
	done := create(t, s, nil)
	_, err = transition(s, done.ID, tasks.Change{To: tasks.Completed, Result: json.RawMessage(`{}`)})
	require.NoError(t, err)
	cancelled := create(t, s, nil)
	_, err = transition(s, cancelled.ID, tasks.Change{To: tasks.Cancelled})
	require.NoError(t, err)
	counts, err = s.CountByStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, map[tasks.Status]int64{tasks.Working: 3, tasks.InputRequired: 0, tasks.Completed: 1, tasks.Failed: 0, tasks.Cancelled: 1}, counts)
}
