package pep

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/dbtest"
)

// TestSecondBinderLeavesTheRequestAlone: the submitter and the reconciler
// may both submit one intent (same Idempotency-Key, same request) and both
// bind. The loser of the bind finds the task already holding this request
// and must not cancel it; a task that ended without it must.
func TestSecondBinderLeavesTheRequestAlone(t *testing.T) {
	ctx := context.Background()
	var cancels atomic.Int32
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cancels.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(backend.Close)
	db := dbtest.New(t)
	g, err := NewGate(Config{DB: db, Backend: &arapclient.Client{BaseURL: backend.URL}, MasterKey: make([]byte, 32), Tools: DemoTools()})
	require.NoError(t, err)
	task := func(id string) {
		_, err = db.Exec(ctx, `INSERT INTO pep.tasks (id, principal, kind, status, created_at, updated_at, poll_interval_ms)
			VALUES ($1, 'user:alice|', $2, 'working', now(), now(), 1000)`, id, KindApproval)
		require.NoError(t, err)
		_, err = db.Exec(ctx, `INSERT INTO pep.approval_tasks (task_id, tool, args_sealed, args_digest, principal, dedup_key, phase, generation, created_at, updated_at)
			VALUES ($1, 'wire_transfer', '\x00', 'd', 'user:alice|', $1, 'submitting', 1, now(), now())`, id)
		require.NoError(t, err)
	}
	response := func(id string) authzen.TaskResponse {
		var tr authzen.TaskResponse
		tr.Task.ID = id
		tr.Task.StatusEndpoint = backend.URL + "/access/v1/requests/" + id
		tr.Task.Links = map[string]any{"cancel": backend.URL + "/access/v1/requests/" + id + "/cancel"}
		return tr
	}

	task("tsk_twice")
	in := &intent{Key: "k1", TaskID: "tsk_twice", Generation: 1}
	require.NoError(t, g.bind(ctx, in, response("arq_1")))
	require.NoError(t, g.bind(ctx, in, response("arq_1")), "the reconciler binds the same request second")
	require.Zero(t, cancels.Load(), "the task's own request is never cancelled by the second binder")
	var phase, backendID string
	require.NoError(t, db.QueryRow(ctx, `SELECT phase, backend_id FROM pep.approval_tasks WHERE task_id = 'tsk_twice'`).Scan(&phase, &backendID))
	require.Equal(t, "pending", phase)
	require.Equal(t, "arq_1", backendID)

	// A task cancelled before its handle arrived: the request is cancelled.
	task("tsk_gone")
	_, _, err = g.cancelLocalWon(ctx, "tsk_gone", "cancelled", actorPEP)
	require.NoError(t, err)
	require.NoError(t, g.bind(ctx, &intent{Key: "k2", TaskID: "tsk_gone", Generation: 1}, response("arq_2")))
	require.Equal(t, int32(1), cancels.Load())
}
