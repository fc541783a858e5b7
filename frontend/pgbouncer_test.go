package frontend_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/frontend"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
)

// TestPgBouncer (issue 36 item 4): the backend and the front-end with
// their pools through PgBouncer in transaction mode (4 server connections
// for every client) and a direct URL for what needs a session of its own
// (ListenURL: LISTEN, migrations). A wire_transfer is gated, approved
// through the decision API, re-evaluated and run once; the processes are
// ready. Every listener's session is direct (PgBouncer reaches PostgreSQL
// on its Unix socket, so its sessions have no client address, the direct
// ones 127.0.0.1), and nothing else is.
func TestPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.NewReplicated(t)
	bouncer := dbtest.NewPgBouncer(t, dbtest.PgBouncerOptions{Host: db.Primary.SocketDir(), Port: db.Primary.Port(), Database: "arap", PoolSize: 4})

	env := backendtest.Start(t, backendtest.Options{DatabaseURL: bouncer.URL, ListenURL: db.URL})
	s := &opsStack{env: env, log: &lockedBuffer{}}
	f, err := frontend.New(ctx, frontend.Config{Addr: "127.0.0.1:0", DatabaseURL: bouncer.URL, ListenURL: db.URL, Migrate: true,
		MasterKey: make([]byte, 32), Tools: pep.DemoTools(), BackendURL: env.URL, BackendToken: dev.PEPToken,
		Log: slog.New(slog.NewJSONHandler(s.log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	require.NoError(t, err)
	s.f = f
	require.NoError(t, f.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = f.Stop(ctx)
	})

	alice := s.caller(t, "alice-agent")
	r, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-7", "amount": 50000}, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeTask, r.ResultType, "%s", r.Raw)
	id := r.Task.TaskID
	var backendID string
	require.NoError(t, f.Pool().QueryRow(ctx, `SELECT backend_id FROM pep.approval_tasks WHERE task_id = $1`, id).Scan(&backendID))
	req, err := http.NewRequest(http.MethodPost, env.URL+"/v1/requests/"+backendID+"/decisions", strings.NewReader(`{"decision": "approve", "reason": "CHG7"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+dev.ITSMToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	// The backend's callback wakes the front-end, which runs the call.
	var d *tasks.Detailed
	require.Eventually(t, func() bool {
		d, _, err = alice.Get(ctx, id)
		return err == nil && d.Status == tasks.Completed
	}, time.Minute, 50*time.Millisecond)
	var runs int
	require.NoError(t, f.Pool().QueryRow(ctx, `SELECT count(*) FROM pep.ledger WHERE task_id = $1`, id).Scan(&runs))
	require.Equal(t, 1, runs)
	code, _ := s.readyz(t)
	require.Equal(t, http.StatusOK, code)

	// Who is connected how.
	conn, err := pgx.Connect(ctx, db.Primary.ConnString("postgres"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT application_name, client_addr IS NOT NULL FROM pg_stat_activity
		WHERE datname = 'arap' AND backend_type = 'client backend' AND pid <> pg_backend_pid()`)
	require.NoError(t, err)
	direct := map[string]int{}
	pooled := 0
	for rows.Next() {
		var name string
		var isDirect bool
		require.NoError(t, rows.Scan(&name, &isDirect))
		if isDirect {
			direct[name]++
		} else {
			pooled++
		}
	}
	require.NoError(t, rows.Err())
	for _, listener := range []string{"arap-attributes-listener", "arap-policy-listener", pep.CallersListener, "arap-tasks-notifier"} {
		require.Equal(t, 1, direct[listener], "%s listens on a session of its own: direct %v", listener, direct)
	}
	require.Equal(t, 2, direct[""], "River's listener, one a process: direct %v", direct)
	require.LessOrEqual(t, pooled, 4, "the pools' sessions are PgBouncer's")
	t.Logf("direct sessions %v, through PgBouncer %d", direct, pooled)
}
