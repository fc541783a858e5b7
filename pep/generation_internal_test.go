package pep

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/internal/dbtest"
)

// TestStaleDecisionLeavesANewerGeneration: an Advance that read the task at
// one generation (say, the max-window denial of the first request) cannot
// end it after it has moved on to the next request (chained after an
// approval that did not suffice): that request would be left live with no
// one tracking it.
func TestStaleDecisionLeavesANewerGeneration(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	g, err := NewGate(Config{DB: db, Backend: &arapclient.Client{BaseURL: "http://127.0.0.1:1"}, MasterKey: make([]byte, 32), Tools: DemoTools()})
	require.NoError(t, err)
	_, err = db.Exec(ctx, `INSERT INTO pep.tasks (id, principal, kind, status, created_at, updated_at, poll_interval_ms)
		VALUES ('tsk_gen', 'user:alice|', $1, 'working', now(), now(), 1000)`, KindApproval)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `INSERT INTO pep.approval_tasks (task_id, tool, args_sealed, args_digest, principal, dedup_key, phase, generation, created_at, updated_at)
		VALUES ('tsk_gen', 'wire_transfer', '\x00', 'd', 'user:alice|', 'k', 'pending', 2, now(), now())`)
	require.NoError(t, err)
	state := func() (phase, status string) {
		require.NoError(t, db.QueryRow(ctx, `SELECT a.phase, t.status FROM pep.approval_tasks a JOIN pep.tasks t ON t.id = a.task_id
			WHERE a.task_id = 'tsk_gen'`).Scan(&phase, &status))
		return phase, status
	}

	stale := &approvalTask{TaskID: "tsk_gen", Generation: 1}
	require.NoError(t, g.deny(ctx, stale, "stale denial"))
	require.NoError(t, g.fail(ctx, stale, "stale failure"))
	phase, status := state()
	require.Equal(t, "pending", phase, "a decision about generation 1 leaves generation 2 alone")
	require.Equal(t, "working", status)

	require.NoError(t, g.deny(ctx, &approvalTask{TaskID: "tsk_gen", Generation: 2}, "current denial"))
	phase, status = state()
	require.Equal(t, "done", phase)
	require.Equal(t, "completed", status)
}
