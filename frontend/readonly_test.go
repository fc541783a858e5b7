package frontend_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/frontend"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/pgembed"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
)

// TestReadOnlyDatabase (issue 36 item 2): the front-end's database address
// comes to lead to a streaming standby (a stale DNS name, a pooler
// pointing at a former primary: a switch in front of both), while the
// backend is well. tools/call answers the retryable error (CodeUnavailable),
// never an internal one, and /readyz is 503 naming the database
// as read-only; back on the primary, the call is served, and /readyz shows
// the durability (a warning: an asynchronous standby only) while ready.
func TestReadOnlyDatabase(t *testing.T) {
	t.Parallel()
	db := dbtest.NewReplicated(t)
	sw := dbtest.NewSwitch(t, dbtest.Addr(db.Primary))
	s := newOpsStackWith(t, nil, func(c *frontend.Config) { c.DatabaseURL = sw.URL(db.URL) })
	alice := s.caller(t, "alice-agent")
	ctx := context.Background()
	args := map[string]any{"to": "acct-9", "amount": 50000}
	r, err := alice.CallTool(ctx, "wire_transfer", args, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeTask, r.ResultType, "%s", r.Raw)
	standby, _ := db.Standby(t, pgembed.StandbyOptions{Name: "async_one"})
	db.WaitReplayed(t, standby)

	type readiness struct {
		Status   string            `json:"status"`
		Failing  []string          `json:"failing"`
		Reasons  map[string]string `json:"reasons"`
		Database *struct {
			ReadOnly          bool   `json:"read_only"`
			InRecovery        bool   `json:"in_recovery"`
			SynchronousCommit string `json:"synchronous_commit"`
			Warning           string `json:"warning"`
		} `json:"database"`
	}
	ready := func() (int, readiness) {
		code, body := s.get(t, pep.PathReady)
		var out readiness
		require.NoError(t, json.Unmarshal([]byte(body), &out), body)
		return code, out
	}
	code, out := ready()
	require.Equal(t, http.StatusOK, code, "%+v", out)
	require.NotNil(t, out.Database)
	require.False(t, out.Database.ReadOnly)
	require.Equal(t, "on", out.Database.SynchronousCommit)
	require.Contains(t, out.Database.Warning, "no synchronous standby is configured", "a warning, not an outage")

	sw.To(dbtest.Addr(standby))
	// The first may meet a connection the switch cut: retryable as well.
	for range 3 {
		_, err = alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-9", "amount": 60000}, nil)
		var re *tasks.RPCError
		require.ErrorAs(t, err, &re)
		require.Equal(t, tasks.CodeUnavailable, re.Code, "%s", re.Message)
		require.Equal(t, "temporarily unavailable: the database is unavailable; retry after 2 s", re.Message)
		// HTTP 503 when refused before the SDK dispatches (the caller's
		// rate limit), else 200 carrying the error.
		t.Logf("tools/call on the standby: HTTP %d", re.HTTPStatus)
	}
	code, out = ready()
	require.Equal(t, http.StatusServiceUnavailable, code, "%+v", out)
	require.Equal(t, "unavailable", out.Status)
	require.Equal(t, []string{"database"}, out.Failing)
	require.Equal(t, "the database is read-only (a standby in recovery, or transaction_read_only is on): writes are refused", out.Reasons["database"])
	require.NotNil(t, out.Database)
	require.True(t, out.Database.ReadOnly)
	require.True(t, out.Database.InRecovery)

	sw.To(dbtest.Addr(db.Primary))
	require.Eventually(t, func() bool { c, _ := ready(); return c == http.StatusOK }, 30*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool {
		r, err := alice.CallTool(ctx, "wire_transfer", args, nil)
		return err == nil && r.ResultType == tasks.ResultTypeTask
	}, 30*time.Second, 50*time.Millisecond)
}
