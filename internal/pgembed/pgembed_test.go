package pgembed_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
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

// TestCrashKeepsCommitted: after an immediate stop (no checkpoint) a durable
// cluster restarts from its WAL with every committed row.
func TestCrashKeepsCommitted(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "pg")
	if os.Geteuid() == 0 {
		require.NoError(t, os.Chmod(filepath.Dir(dir), 0o755))
		require.NoError(t, os.Chmod(filepath.Dir(filepath.Dir(dir)), 0o755))
	}
	c, err := pgembed.Start(ctx, pgembed.Options{DataDir: dir})
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, c.ConnString("postgres"))
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (7)")
	require.NoError(t, err)
	c.Crash()
	require.Error(t, conn.Ping(ctx), "the server is gone")
	conn.Close(ctx)

	c, err = pgembed.Start(ctx, pgembed.Options{DataDir: dir})
	require.NoError(t, err)
	defer c.Stop(ctx)
	conn, err = pgx.Connect(ctx, c.ConnString("postgres"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var v int
	require.NoError(t, conn.QueryRow(ctx, "SELECT v FROM kept").Scan(&v))
	require.Equal(t, 7, v)
	require.FileExists(t, dir+".log")
}
