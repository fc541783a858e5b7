package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
)

// mainEnv makes the test binary run arapd's main instead of the tests.
const mainEnv = "ARAPD_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) != "" {
		os.Args = append([]string{"arapd"}, os.Args[1:]...)
		main()
		os.Exit(0)
	}
	dbtest.Main(m)
}

// arapd runs arapd's main in a child process with env (and no ARAP_*
// variables or DATABASE_URL of the test's own) and returns its exit
// status, standard output and standard error.
func arapd(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ARAP_") && !strings.HasPrefix(kv, "DATABASE_URL=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(append(cmd.Env, mainEnv+"=1"), env...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil {
		require.ErrorAs(t, err, &ee)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errOut.String()
}

const testKey = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="

func TestVersion(t *testing.T) {
	code, out, errOut := arapd(t, nil, "--version")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `^arapd \S+ \(revision \S+, go[0-9.]+\S*\)\n$`, out)
}

// TestHelpNamesVariablesAndKeys: every command's -h lists each flag with
// its variable and config key, and where each secret may come from.
func TestHelpNamesVariablesAndKeys(t *testing.T) {
	code, out, _ := arapd(t, nil, "serve", "-h")
	require.Equal(t, 0, code)
	require.Contains(t, out, "  --job-timeout duration\n      bound on a background job; a job whose worker died is retried after twice this (default 1m0s)\n      env ARAP_JOB_TIMEOUT; config key job-timeout\n")
	require.Contains(t, out, "  --trusted-proxies string\n")
	require.Contains(t, out, "env ARAP_TRUSTED_PROXIES; config key trusted-proxies\n")
	require.Contains(t, out, "  the PostgreSQL URL (it may hold a password)\n      env ARAP_DATABASE_URL or DATABASE_URL, or a file: --database-url-file, env ARAP_DATABASE_URL_FILE, config key database-url-file\n")
	require.Contains(t, out, "env ARAP_MASTER_KEY, or a file: --master-key-file, env ARAP_MASTER_KEY_FILE, config key master-key-file\n")
	require.NotContains(t, out, "  --database-url string", "the database URL is never a flag")

	code, out, _ = arapd(t, nil, "mcp", "-h")
	require.Equal(t, 0, code)
	require.Contains(t, out, "  --addr string\n      listen address (default 127.0.0.1:8481)\n      env ARAP_MCP_ADDR; config key addr\n")
	require.Contains(t, out, "env ARAP_MCP_PUBLIC_URL; config key public-url\n")
	require.Contains(t, out, "env ARAP_PEP_MASTER_KEY, or a file: --master-key-file, env ARAP_PEP_MASTER_KEY_FILE, config key master-key-file\n")
	require.Contains(t, out, "env ARAP_BACKEND_TOKEN, or a file: --backend-token-file, env ARAP_BACKEND_TOKEN_FILE, config key backend-token-file\n")
	require.Contains(t, out, "env ARAP_WEBHOOK_SECRETS, or a file: --webhook-secrets-file, env ARAP_WEBHOOK_SECRETS_FILE, config key webhook-secrets-file\n")

	for _, cmd := range []string{"dev", "migrate"} {
		code, out, _ = arapd(t, nil, cmd, "-h")
		require.Equal(t, 0, code)
		require.Contains(t, out, "usage: arapd "+cmd+" [flags]\n")
		require.Contains(t, out, "env ARAP_LOG_LEVEL; config key log-level\n")
	}
}

// TestBadSettingsStopStartUp: a value that does not parse, from any
// source, stops start-up with a message naming it (they were once ignored
// silently), before any connection is made.
func TestBadSettingsStopStartUp(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "arap.conf")
	require.NoError(t, os.WriteFile(conf, []byte("addr 127.0.0.1:0\nexec-timeout 30\n"), 0o600))
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{env: []string{"ARAP_JOB_TIMEOUT=30"}, args: []string{"serve"}, want: `arapd: ARAP_JOB_TIMEOUT="30": want a duration such as 30s, 5m or 1h30m`},
		{env: []string{"ARAP_LOCAL_PASSWORDS=maybe"}, args: []string{"serve"}, want: `arapd: ARAP_LOCAL_PASSWORDS="maybe": want true or false`},
		{env: []string{"ARAP_RATE_LIMIT=lots"}, args: []string{"serve"}, want: `arapd: ARAP_RATE_LIMIT="lots": want a whole number`},
		{env: []string{"ARAP_LISTEN_STREAMS=ten"}, args: []string{"mcp"}, want: `arapd: ARAP_LISTEN_STREAMS="ten": want a whole number`},
		{env: []string{"ARAP_LOG_LEVEL=loud"}, args: []string{"mcp"}, want: `arapd: ARAP_LOG_LEVEL="loud": slog: level string "loud": unknown name`},
		{args: []string{"mcp", "--config", conf}, want: "arapd: " + conf + `:2: exec-timeout "30": want a duration such as 30s, 5m or 1h30m`},
		{env: []string{"ARAP_CONFIG=" + conf}, args: []string{"mcp"}, want: "arapd: " + conf + `:2: exec-timeout "30": want a duration such as 30s, 5m or 1h30m`},
		{args: []string{"serve", "--trusted-proxies", "proxy.local"}, env: []string{"ARAP_MASTER_KEY=" + testKey}, want: `arapd: --trusted-proxies: trusted proxy "proxy.local": want an address or a CIDR prefix such as 10.0.0.0/8`},
		{args: []string{"serve", "--database-url", "postgres://u:secret@db/arap"}, want: "arapd: no such flag: --database-url"},
	} {
		code, _, errOut := arapd(t, c.env, c.args...)
		require.Equal(t, 1, code, "%v %v: %s", c.env, c.args, errOut)
		require.Equal(t, c.want+"\n", errOut, "%v %v", c.env, c.args)
	}
}

// TestSecretFromBothPlacesRefused: a secret set in its variable and as a
// file is an error naming both, for each process's secrets.
func TestSecretFromBothPlacesRefused(t *testing.T) {
	file := filepath.Join(t.TempDir(), "key")
	require.NoError(t, os.WriteFile(file, []byte(testKey+"\n"), 0o600))
	code, _, errOut := arapd(t, []string{"ARAP_BACKEND_TOKEN=t", "ARAP_PEP_MASTER_KEY=" + testKey, "ARAP_PEP_MASTER_KEY_FILE=" + file}, "mcp")
	require.Equal(t, 1, code)
	require.Equal(t, "arapd: the base64 32-byte key sealing stored arguments is set both in ARAP_PEP_MASTER_KEY and as a file (--master-key-file, ARAP_PEP_MASTER_KEY_FILE or the config file's master-key-file); set one\n", errOut)
	code, _, errOut = arapd(t, []string{"ARAP_MASTER_KEY=" + testKey, "ARAP_DATABASE_URL=postgres://x"}, "serve", "--master-key-file", file, "--database-url-file", file)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "is set both in ARAP_")
	code, _, errOut = arapd(t, []string{"ARAP_PEP_MASTER_KEY=" + testKey}, "mcp")
	require.Equal(t, 1, code)
	require.Equal(t, "arapd: the front-end's API token at the backend (scopes evaluate and request) is required: ARAP_BACKEND_TOKEN or --backend-token-file (ARAP_BACKEND_TOKEN_FILE)\n", errOut)
}

// TestSchemaCheckAtStartUp: both processes refuse an unmigrated database
// with what to run; arapd migrate --status shows the pending migrations,
// and, after arapd migrate, that this binary can run.
func TestSchemaCheckAtStartUp(t *testing.T) {
	url := dbtest.URL(t)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	defer pool.Close()
	_, err = pool.Exec(context.Background(), "DROP SCHEMA arap CASCADE; DROP SCHEMA pep CASCADE; DROP SCHEMA river CASCADE; DROP SCHEMA pep_river CASCADE; DROP TABLE public.arap_schema_migrations")
	require.NoError(t, err)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	require.NoError(t, os.WriteFile(policy, dev.SeedPolicy(), 0o600))
	env := []string{"DATABASE_URL=" + url, "ARAP_MASTER_KEY=" + testKey, "ARAP_PEP_MASTER_KEY=" + testKey, "ARAP_BACKEND_TOKEN=t", "ARAP_POLICY=" + policy}
	for _, cmd := range [][]string{{"serve"}, {"mcp", "--demo-tools"}} {
		code, _, errOut := arapd(t, env, append(cmd, "--addr", "127.0.0.1:0")...)
		require.Equal(t, 1, code, errOut)
		require.Contains(t, errOut, "database schema: schema arap is not migrated: the database is at version 0000, this binary needs ")
		require.Contains(t, errOut, "run `arapd migrate` (or start with --migrate)")
	}
	code, out, errOut := arapd(t, env, "migrate", "--status")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "schema arap: database at 0000, this binary knows up to ")
	require.Contains(t, out, "  0001_init  pending\n")
	require.True(t, strings.HasSuffix(out, "this binary cannot run against the database\n"), out)

	code, _, errOut = arapd(t, env, "migrate")
	require.Equal(t, 0, code, errOut)
	code, out, errOut = arapd(t, env, "migrate", "--status")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "  0001_init  applied\n")
	require.NotContains(t, out, "  pending\n")
	require.True(t, strings.HasSuffix(out, "\nthis binary can run against the database\n"), out)

	// A later binary's migrations, recorded as it would: one declared
	// compatible with this binary, then one that is not.
	var newest int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT max(version) FROM public.arap_schema_migrations WHERE schema = 'arap'").Scan(&newest))
	_, err = pool.Exec(context.Background(), "INSERT INTO public.arap_schema_migrations (schema, version, name, compatible_with) VALUES ('arap', $1, 'additive', $2)", newest+1, newest)
	require.NoError(t, err)
	code, out, errOut = arapd(t, env, "migrate", "--status")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, fmt.Sprintf("  %04d_additive  applied, unknown to this binary (compatible with binaries knowing %04d or later)\n", newest+1, newest))
	require.True(t, strings.HasSuffix(out, "\nthis binary can run against the database\n"), out)
	_, err = pool.Exec(context.Background(), "INSERT INTO public.arap_schema_migrations (schema, version, name, compatible_with) VALUES ('arap', $1, 'breaking', $1)", newest+2)
	require.NoError(t, err)
	for _, cmd := range [][]string{{"serve"}, {"mcp", "--demo-tools"}} {
		code, _, errOut := arapd(t, env, append(cmd, "--addr", "127.0.0.1:0")...)
		require.Equal(t, 1, code, errOut)
		require.Contains(t, errOut, fmt.Sprintf("database schema: schema arap is newer than this binary: the database has %04d_breaking, which needs a binary knowing at least %04d, and this binary knows up to %04d; run the newer arapd", newest+2, newest+2, newest))
	}
}

// TestMCPWithoutToolsRefusesToStart (issue 38): arapd mcp offers the demo
// tools only with --demo-tools; given no upstreams either, it stops before
// connecting anywhere and says what to give it.
func TestMCPWithoutToolsRefusesToStart(t *testing.T) {
	env := []string{"ARAP_BACKEND_TOKEN=t", "ARAP_PEP_MASTER_KEY=" + testKey, "DATABASE_URL=postgres://nobody@127.0.0.1:1/none"}
	code, _, errOut := arapd(t, env, "mcp")
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "no tools to offer: give --upstreams FILE (ARAP_UPSTREAMS)")
	require.Contains(t, errOut, "--demo-tools (ARAP_DEMO_TOOLS=true)")
	code, out, _ := arapd(t, nil, "mcp", "-h")
	require.Equal(t, 0, code)
	require.Contains(t, out, "  --demo-tools\n")
	require.Contains(t, out, "never in production")
}
