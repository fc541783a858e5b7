package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/attributes"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
)

// TestDevFileNames: arapctl looks where `arapd dev` writes.
func TestDevFileNames(t *testing.T) {
	require.Equal(t, dev.DefaultDataDir, devDataDir)
	require.Equal(t, dev.DatabaseURLFile, devDatabaseURLFile)
}

// writeDevURL records url as `arapd dev` does, in dir/.arap-dev.
func writeDevURL(t *testing.T, dir, url string, mode os.FileMode) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, devDataDir), 0o711))
	path := filepath.Join(dir, devDataDir, devDatabaseURLFile)
	require.NoError(t, os.WriteFile(path, []byte(url+"\n"), mode))
	require.NoError(t, os.Chmod(path, mode))
}

// TestDevDatabase: with DATABASE_URL unset, the database commands use the
// database `arapd dev` recorded in ./.arap-dev/database-url and say so; a
// file someone else could have written is refused; a recorded database that
// is gone says that arapd dev must be running; with neither, the error says
// what to set.
func TestDevDatabase(t *testing.T) {
	dbURL := dbtest.URL(t)
	dir := t.TempDir()
	t.Chdir(dir)
	t.Setenv("DATABASE_URL", "")

	_, err := ctl(t, "attributes", "list")
	require.ErrorContains(t, err, "no database: set DATABASE_URL (or ARAP_DATABASE_URL, or --database-url-file) (with `arapd dev` running, run arapctl in the directory it runs in")

	writeDevURL(t, dir, dbURL, 0o600)
	out, notes, err := ctlNotes(t, "attributes", "set", "change_freeze", "true")
	require.NoError(t, err)
	require.Equal(t, "attribute change_freeze set; automated resolvers of pending requests will run again\n", out)
	require.Equal(t, "arapctl: DATABASE_URL is unset; using the database of arapd dev (.arap-dev/database-url)\n", notes)
	db, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	defer db.Close()
	snap, err := attributes.NewStore(db).Snapshot(context.Background())
	require.NoError(t, err)
	require.Equal(t, true, snap["change_freeze"], "set in the recorded database")

	// DATABASE_URL and --database-url-file come first, silently.
	writeDevURL(t, dir, "postgres://nobody@127.0.0.1:1/gone?connect_timeout=2", 0o600)
	t.Setenv("DATABASE_URL", dbURL)
	out, notes, err = ctlNotes(t, "attributes", "list")
	require.NoError(t, err)
	require.JSONEq(t, `{"change_freeze": true}`, out)
	require.Empty(t, notes)
	t.Setenv("DATABASE_URL", "")
	urlFile := filepath.Join(t.TempDir(), "database-url")
	require.NoError(t, os.WriteFile(urlFile, []byte(dbURL+"\n"), 0o600))
	_, notes, err = ctlNotes(t, "attributes", "list", "--database-url-file", urlFile)
	require.NoError(t, err)
	require.Empty(t, notes)

	// The recorded cluster is not running.
	writeDevURL(t, dir, "postgres://postgres@/arap?host="+filepath.Join(dir, "no-socket-here")+"&sslmode=disable", 0o600)
	_, err = ctl(t, "attributes", "list")
	require.ErrorContains(t, err, "cannot reach the database of arapd dev (.arap-dev/database-url): ")
	require.ErrorContains(t, err, "its private cluster is reachable only while `arapd dev` runs")

	// A file others may write (as one checked out of a repository is) is
	// not trusted to choose the database.
	writeDevURL(t, dir, dbURL, 0o644)
	_, err = ctl(t, "attributes", "list")
	require.EqualError(t, err, "not using .arap-dev/database-url: it must be a file of your own that only you can read (mode 0600), as arapd dev writes it; set DATABASE_URL instead")
}

// TestWebhooksCommands: arapctl webhooks create, list and delete a webhook
// target; a URL the client's callbacks could not use is refused, and so is
// a client without a webhook secret.
func TestWebhooksCommands(t *testing.T) {
	dbURL := dbtest.URL(t)
	t.Setenv("DATABASE_URL", dbURL)
	t.Setenv("ARAP_MASTER_KEY", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")
	_, err := ctl(t, "clients", "create", "--name", "servicenow", "--scope", "decide", "--kind", "itsm",
		"--callback-prefix", "http://127.0.0.1:", "--callback-network", "loopback")
	require.NoError(t, err)
	_, err = ctl(t, "webhooks", "create", "itsm", "--client", "servicenow", "--url", "http://127.0.0.1:9/arap")
	require.ErrorContains(t, err, `client "servicenow" has no webhook secret`)
	_, err = ctl(t, "clients", "secret", "rotate", "servicenow")
	require.NoError(t, err)
	_, err = ctl(t, "webhooks", "create", "itsm", "--client", "servicenow", "--url", "http://127.0.0.1.nip.invalid/arap")
	require.ErrorContains(t, err, "not under any callback prefix")
	out, err := ctl(t, "webhooks", "create", "itsm", "--client", "servicenow", "--url", "http://127.0.0.1:9/arap")
	require.NoError(t, err)
	require.Contains(t, out, "created webhook target itsm: http://127.0.0.1:9/arap")
	_, err = ctl(t, "webhooks", "create", "itsm", "--client", "servicenow", "--url", "http://127.0.0.1:9/arap")
	require.ErrorContains(t, err, `webhook target "itsm" already exists`)
	out, err = ctl(t, "webhooks", "list", "--json")
	require.NoError(t, err)
	require.Contains(t, out, `"name":"itsm","client":"servicenow","url":"http://127.0.0.1:9/arap"`)
	out, err = ctl(t, "webhooks", "delete", "itsm")
	require.NoError(t, err)
	require.Equal(t, "deleted webhook target itsm\n", out)
	_, err = ctl(t, "webhooks", "delete", "itsm")
	require.ErrorContains(t, err, "no such webhook target")
}
