package pgembed_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/pgembed"
)

// dirForServer is a directory the server account can enter (when the
// tests run as root, the server runs as another account).
func dirForServer(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "arap-pgembed-test-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	return dir
}

func connect(t *testing.T, c *pgembed.Cluster) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.ConnString("postgres"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func count(t *testing.T, conn *pgx.Conn) (n int) {
	t.Helper()
	require.NoError(t, conn.QueryRow(context.Background(), "SELECT count(*) FROM kept").Scan(&n))
	return n
}

func syncState(t *testing.T, primary *pgx.Conn, name string) (s string) {
	t.Helper()
	require.NoError(t, primary.QueryRow(context.Background(),
		"SELECT sync_state FROM pg_stat_replication WHERE application_name = $1", name).Scan(&s))
	return s
}

// TestStandbyAsync: an asynchronous standby follows the primary's writes,
// refuses its own with 25006 read_only_sql_transaction, is in recovery, and
// after Promote takes writes; the primary never waits for it.
func TestStandbyAsync(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, err := pgembed.Start(ctx, pgembed.Options{Ephemeral: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Stop(ctx) })
	pc := connect(t, p)
	_, err = pc.Exec(ctx, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (1)")
	require.NoError(t, err)

	s, err := p.StartStandby(ctx, pgembed.StandbyOptions{Name: "replica_a", Port: -1, Ephemeral: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Stop(ctx) })
	require.Contains(t, s.ConnString("postgres"), "127.0.0.1:")
	require.Equal(t, "async", syncState(t, pc, "replica_a"))

	_, err = pc.Exec(ctx, "INSERT INTO kept VALUES (2)")
	require.NoError(t, err)
	sc := connect(t, s)
	require.Eventually(t, func() bool { return count(t, sc) == 2 }, 30*time.Second, 20*time.Millisecond)
	var recovering bool
	require.NoError(t, sc.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&recovering))
	require.True(t, recovering)
	_, err = sc.Exec(ctx, "INSERT INTO kept VALUES (3)")
	var pe *pgconn.PgError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "25006", pe.Code, "read_only_sql_transaction")

	// The standby gone, the primary goes on committing.
	require.NoError(t, s.Kill())
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = pc.Exec(wctx, "INSERT INTO kept VALUES (4)")
	require.NoError(t, err)

	// A second one, promoted, takes writes.
	s2, err := p.StartStandby(ctx, pgembed.StandbyOptions{Name: "replica_b"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s2.Stop(ctx) })
	require.NoError(t, s2.Promote(ctx))
	s2c := connect(t, s2)
	_, err = s2c.Exec(ctx, "INSERT INTO kept VALUES (5)")
	require.NoError(t, err)
	require.Equal(t, 4, count(t, s2c))
}

// TestStandbySynchronousFailover: with a synchronous standby every commit
// the primary acknowledged is on the standby, so after the primary is
// killed (SIGKILL) and the standby promoted, none is lost; while the
// synchronous standby is missing, a commit waits. The promoted standby
// does not wait for standbys of its own (the primary's
// synchronous_standby_names is not carried over).
func TestStandbySynchronousFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Not Ephemeral: its synchronous_commit=off would not wait.
	p, err := pgembed.Start(ctx, pgembed.Options{Port: -1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Stop(ctx) })
	pc := connect(t, p)
	_, err = pc.Exec(ctx, "CREATE TABLE kept (v int)")
	require.NoError(t, err)

	s, err := p.StartStandby(ctx, pgembed.StandbyOptions{Name: "sync_one", Synchronous: true, Port: -1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Stop(ctx) })
	require.Equal(t, "sync", syncState(t, pc, "sync_one"))
	var names string
	require.NoError(t, pc.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&names))
	require.Equal(t, `"sync_one"`, names)

	// A second synchronous standby is a potential one.
	s2, err := p.StartStandby(ctx, pgembed.StandbyOptions{Name: "sync_two", Synchronous: true})
	require.NoError(t, err)
	require.NoError(t, pc.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&names))
	require.Equal(t, `"sync_one", "sync_two"`, names)
	require.Equal(t, "potential", syncState(t, pc, "sync_two"))
	require.NoError(t, s2.Stop(ctx))

	for i := range 50 {
		_, err := pc.Exec(ctx, "INSERT INTO kept VALUES ($1)", i)
		require.NoError(t, err)
	}
	pid := p.Pid()
	require.NoError(t, p.Kill())
	require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "the postmaster is gone")
	require.NoError(t, s.Promote(ctx))
	sc := connect(t, s)
	require.Equal(t, 50, count(t, sc), "every acknowledged commit survives the failover")
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = sc.Exec(wctx, "INSERT INTO kept VALUES (50)")
	require.NoError(t, err, "the promoted standby does not wait for standbys")
	require.NoError(t, sc.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&names))
	require.Empty(t, names)
}

// TestSynchronousStandbyMissingWaits: a commit on a primary whose
// synchronous standby is gone waits for it (here until the client gives
// up).
func TestSynchronousStandbyMissingWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, err := pgembed.Start(ctx, pgembed.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Stop(ctx) })
	s, err := p.StartStandby(ctx, pgembed.StandbyOptions{Synchronous: true})
	require.NoError(t, err)
	pc := connect(t, p)
	_, err = pc.Exec(ctx, "CREATE TABLE kept (v int)")
	require.NoError(t, err)
	require.NoError(t, s.Kill())
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = pc.Exec(wctx, "INSERT INTO kept VALUES (1)")
	require.Error(t, err, "the commit waits for the synchronous standby")
}

// TestKillThenRestartRecovers: after Kill, Start on the same data
// directory and port recovers the cluster with its commits.
func TestKillThenRestartRecovers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	opts := pgembed.Options{DataDir: filepath.Join(dirForServer(t), "data"), Port: -1}
	c, err := pgembed.Start(ctx, opts)
	require.NoError(t, err)
	opts.Port = c.Port()
	conn, err := pgx.Connect(ctx, c.ConnString("postgres"))
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (1)")
	require.NoError(t, err)
	require.NoError(t, c.Kill())
	_, err = conn.Exec(ctx, "SELECT 1")
	require.Error(t, err, "the session ended with the server")
	_ = conn.Close(ctx)
	require.NoError(t, c.Stop(ctx), "Stop after Kill does nothing")

	c, err = pgembed.Start(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop(ctx) })
	require.Equal(t, 1, count(t, connect(t, c)))
}

// TestStandbyRefusesUsedDataDir: a standby is a fresh base backup.
func TestStandbyRefusesUsedDataDir(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, err := pgembed.Start(ctx, pgembed.Options{Ephemeral: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Stop(ctx) })
	_, err = p.StartStandby(ctx, pgembed.StandbyOptions{DataDir: p.DataDir()})
	require.ErrorContains(t, err, "already holds a cluster")
}
