package pgembed_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/pgembed"
)

func TestStartQueryStopReuse(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "pg")
	if os.Geteuid() == 0 {
		// The unprivileged server account must be able to reach the directory.
		require.NoError(t, os.Chmod(filepath.Dir(dir), 0o755))
		require.NoError(t, os.Chmod(filepath.Dir(filepath.Dir(dir)), 0o755))
	}
	c, err := pgembed.Start(ctx, pgembed.Options{DataDir: dir, Ephemeral: true})
	require.NoError(t, err)

	conn, err := pgx.Connect(ctx, c.ConnString("postgres"))
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)")
	require.NoError(t, err)
	var user string
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_user").Scan(&user))
	require.Equal(t, "postgres", user)
	conn.Close(ctx)
	require.NoError(t, c.Stop(ctx))

	// A second start reuses the cluster and its data.
	c, err = pgembed.Start(ctx, pgembed.Options{DataDir: dir, Port: -1})
	require.NoError(t, err)
	defer c.Stop(ctx)
	require.Contains(t, c.ConnString("db"), "127.0.0.1:")
	conn, err = pgx.Connect(ctx, c.ConnString("postgres"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var v int
	require.NoError(t, conn.QueryRow(ctx, "SELECT v FROM kept").Scan(&v))
	require.Equal(t, 42, v)
}

func TestTemporaryClusterIsRemoved(t *testing.T) {
	ctx := context.Background()
	c, err := pgembed.Start(ctx, pgembed.Options{Ephemeral: true})
	require.NoError(t, err)
	dir := c.DataDir()
	require.DirExists(t, dir)
	require.NoError(t, c.Stop(ctx))
	require.NoDirExists(t, dir)
}

func TestMissingBinariesNameThePackage(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	restore := pgembed.SetSearchGlobForTest(filepath.Join(t.TempDir(), "*", "bin"))
	defer restore()
	_, err := pgembed.Start(context.Background(), pgembed.Options{})
	require.True(t, errors.Is(err, pgembed.ErrNotInstalled))
	require.Contains(t, err.Error(), "apt-get install postgresql")
}

func TestRootRefusesUnreachableDataDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only meaningful as root")
	}
	closed := t.TempDir()
	require.NoError(t, os.Chmod(closed, 0o700))
	_, err := pgembed.Start(context.Background(), pgembed.Options{DataDir: filepath.Join(closed, "pg")})
	var nt *pgembed.NotTraversableError
	require.ErrorAs(t, err, &nt)
}

// TestStopImmediateIsACrash: StopImmediate leaves the cluster as a crash
// would (pg_controldata: "in production", recovered at the next start),
// Stop leaves it shut down; either way Start on the same DataDir and Port
// serves the committed data again at the same address.
func TestStopImmediateIsACrash(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "pg")
	if os.Geteuid() == 0 {
		require.NoError(t, os.Chmod(filepath.Dir(dir), 0o755))
		require.NoError(t, os.Chmod(filepath.Dir(filepath.Dir(dir)), 0o755))
	}
	bin, err := pgembed.BinDir()
	require.NoError(t, err)
	state := func() string {
		out, err := exec.Command(filepath.Join(bin, "pg_controldata"), "-D", dir).CombinedOutput()
		require.NoError(t, err, "%s", out)
		for _, line := range strings.Split(string(out), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && k == "Database cluster state" {
				return strings.TrimSpace(v)
			}
		}
		t.Fatalf("no cluster state in %s", out)
		return ""
	}
	c, err := pgembed.Start(ctx, pgembed.Options{DataDir: dir, Port: -1})
	require.NoError(t, err)
	port := c.Port()
	conn, err := pgx.Connect(ctx, c.ConnString("postgres"))
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)")
	require.NoError(t, err)
	conn.Close(ctx)

	require.NoError(t, c.StopImmediate(ctx))
	require.Equal(t, "in production", state(), "not shut down cleanly")
	c, err = pgembed.Start(ctx, pgembed.Options{DataDir: dir, Port: port})
	require.NoError(t, err)
	require.Equal(t, port, c.Port())
	conn, err = pgx.Connect(ctx, c.ConnString("postgres"))
	require.NoError(t, err)
	var v int
	require.NoError(t, conn.QueryRow(ctx, "SELECT v FROM kept").Scan(&v))
	require.Equal(t, 42, v, "committed before the crash")
	conn.Close(ctx)
	require.NoError(t, c.Stop(ctx))
	require.Equal(t, "shut down", state())
}

// TestSecondServerOnOneDataDir (issue 38): a second server on a data
// directory one already runs on (a second arapd dev in one directory) says
// so and what to do, not only that postgres exited.
func TestSecondServerOnOneDataDir(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "data")
	if os.Geteuid() == 0 {
		// The unprivileged server account must be able to reach the directory.
		require.NoError(t, os.Chmod(filepath.Dir(dir), 0o755))
		require.NoError(t, os.Chmod(filepath.Dir(filepath.Dir(dir)), 0o755))
	}
	c, err := pgembed.Start(ctx, pgembed.Options{DataDir: dir, Ephemeral: true})
	require.NoError(t, err)
	defer func() { _ = c.Stop(ctx) }()
	_, err = pgembed.Start(ctx, pgembed.Options{DataDir: dir, Ephemeral: true})
	require.ErrorContains(t, err, "another PostgreSQL already runs on "+dir)
	require.ErrorContains(t, err, "--data-dir")
}
