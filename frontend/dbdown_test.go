package frontend_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/mcp/tasks"
)

// TestDatabaseDown: `arapd mcp` as wired (caller cache and its listener,
// notifier, River) and the backend on one PostgreSQL that is stopped, fast
// and then as a crash: /readyz names the database, tasks/get and tools/call
// answer the retryable error (HTTP 503, CodeUnavailable) and nothing else;
// after the restart all is served again and the task is as it was.
func TestDatabaseDown(t *testing.T) {
	db := dbtest.NewPrivate(t)
	s := newOpsStackOn(t, db)
	alice := s.caller(t, "alice-agent")
	ctx := context.Background()
	args := map[string]any{"to": "acct-9", "amount": 50000}
	r, err := alice.CallTool(ctx, "wire_transfer", args, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeTask, r.ResultType, "%s", r.Raw)
	id := r.Task.TaskID

	for _, immediate := range []bool{false, true} {
		db.Stop(t, immediate)
		code, failing := s.readyz(t)
		require.Equal(t, http.StatusServiceUnavailable, code)
		require.Contains(t, failing, "database")

		_, _, err = alice.Get(ctx, id)
		var re *tasks.RPCError
		require.ErrorAs(t, err, &re)
		require.Equal(t, tasks.CodeUnavailable, re.Code, "%s", re.Message)
		require.Contains(t, re.Message, "retry after 2 s")
		t.Logf("tasks/get during the outage: HTTP %d", re.HTTPStatus)
		_, err = alice.CallTool(ctx, "wire_transfer", args, nil)
		require.ErrorAs(t, err, &re)
		require.Equal(t, tasks.CodeUnavailable, re.Code, "%s", re.Message)

		db.Start(t)
		require.Eventually(t, func() bool {
			code, _ := s.readyz(t)
			return code == http.StatusOK
		}, 30*time.Second, 50*time.Millisecond)
		require.Eventually(t, func() bool {
			d, _, err := alice.Get(ctx, id)
			return err == nil && d.Status == tasks.Working
		}, 30*time.Second, 50*time.Millisecond)
	}
}
