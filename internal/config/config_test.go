package config_test

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/config"
)

type settings struct {
	set     *config.Set
	addr    *string
	timeout *time.Duration
	n       *int
	on      *bool
	key     *config.Secret
	db      *config.Secret
	help    strings.Builder
}

// newSettings is a command like arapd mcp: --addr with its own variable,
// the others by the default rule, two secrets, one with an alias.
func newSettings(env map[string]string) *settings {
	s := &settings{}
	s.set = config.New("arapd test", &s.help).WithLookup(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	s.addr = s.set.String("addr", "127.0.0.1:8481", "listen address", "ARAP_TEST_ADDR")
	s.timeout = s.set.Duration("exec-timeout", 30*time.Second, "bound on a run")
	s.n = s.set.Int("listen-streams", 10, "streams per caller")
	s.on = s.set.Bool("local-passwords", true, "allow passwords")
	s.key = s.set.Secret("master-key", "the master key", "ARAP_PEP_MASTER_KEY")
	s.db = s.set.Secret("database-url", "the PostgreSQL URL", "ARAP_DATABASE_URL", "DATABASE_URL")
	return s
}

func write(t *testing.T, name, content string) string {
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

// TestPrecedence: flag > environment > config file > default, setting by
// setting.
func TestPrecedence(t *testing.T) {
	file := write(t, "arap.conf", "# the file\naddr 10.0.0.1:1\nexec-timeout 1m\nlisten-streams 3\nlocal-passwords false # no passwords\n")
	s := newSettings(map[string]string{"ARAP_CONFIG": file, "ARAP_EXEC_TIMEOUT": "2m", "ARAP_TEST_ADDR": "10.0.0.2:2"})
	require.NoError(t, s.set.Parse([]string{"--addr", "10.0.0.3:3"}))
	require.Equal(t, "10.0.0.3:3", *s.addr, "the flag wins over the variable and the file")
	require.Equal(t, 2*time.Minute, *s.timeout, "the variable wins over the file")
	require.Equal(t, 3, *s.n, "the file wins over the default")
	require.False(t, *s.on)

	s = newSettings(map[string]string{"ARAP_TEST_ADDR": "10.0.0.2:2"})
	require.NoError(t, s.set.Parse([]string{"--config", file}))
	require.Equal(t, "10.0.0.2:2", *s.addr, "the variable wins over the file")
	require.Equal(t, time.Minute, *s.timeout)

	s = newSettings(nil)
	require.NoError(t, s.set.Parse(nil))
	require.Equal(t, "127.0.0.1:8481", *s.addr)
	require.Equal(t, 30*time.Second, *s.timeout)
	require.True(t, *s.on)
	require.False(t, s.key.IsSet())
}

// TestBadValues: a value that does not parse stops start-up, naming the
// flag, the variable or the file's line; an unknown key too.
func TestBadValues(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{args: []string{"--exec-timeout", "soon"}, want: `--exec-timeout "soon": want a duration such as 30s, 5m or 1h30m`},
		{env: map[string]string{"ARAP_EXEC_TIMEOUT": "30"}, want: `ARAP_EXEC_TIMEOUT="30": want a duration such as 30s, 5m or 1h30m`},
		{env: map[string]string{"ARAP_LISTEN_STREAMS": "ten"}, want: `ARAP_LISTEN_STREAMS="ten": want a whole number`},
		{env: map[string]string{"ARAP_LOCAL_PASSWORDS": "nope"}, want: `ARAP_LOCAL_PASSWORDS="nope": want true or false`},
		{args: []string{"--no-such"}, want: "no such flag: --no-such"},
		{args: []string{"stray"}, want: `unexpected argument "stray"`},
	} {
		err := newSettings(c.env).set.Parse(c.args)
		require.EqualError(t, err, c.want)
	}
	file := write(t, "bad.conf", "addr 10.0.0.1:1\n\n# fine so far\nexec-timeout forever\n")
	err := newSettings(nil).set.Parse([]string{"--config", file})
	require.EqualError(t, err, file+`:4: exec-timeout "forever": want a duration such as 30s, 5m or 1h30m`)
	file = write(t, "unknown.conf", "addr 10.0.0.1:1\nadress 10.0.0.1:2\n")
	err = newSettings(nil).set.Parse([]string{"--config", file})
	require.EqualError(t, err, file+`:2: unknown key "adress"`)
	file = write(t, "secret.conf", "master-key c2VjcmV0\n")
	err = newSettings(nil).set.Parse([]string{"--config", file})
	require.EqualError(t, err, file+`:1: unknown key "master-key" (a secret is never in the config file: name a file holding it with master-key-file)`)
	err = newSettings(map[string]string{"ARAP_CONFIG": "/nonexistent/arap.conf"}).set.Parse(nil)
	require.ErrorContains(t, err, "config file /nonexistent/arap.conf")
}

// TestSecrets: a secret comes from its variable (or an alias) or a file
// named by flag, variable or config key; both at once is an error naming
// both; it is never a flag.
func TestSecrets(t *testing.T) {
	keyFile := write(t, "key", "a2V5\n")
	s := newSettings(map[string]string{"ARAP_PEP_MASTER_KEY": " a2V5 ", "DATABASE_URL": "postgres://old"})
	require.NoError(t, s.set.Parse(nil))
	require.Equal(t, "a2V5", s.key.Value())
	require.Equal(t, "postgres://old", s.db.Value(), "the alias")

	s = newSettings(map[string]string{"ARAP_DATABASE_URL": "postgres://new", "DATABASE_URL": "postgres://old"})
	require.NoError(t, s.set.Parse(nil))
	require.Equal(t, "postgres://new", s.db.Value(), "the first name wins over its alias")

	for _, c := range []struct {
		env  map[string]string
		args []string
	}{
		{args: []string{"--master-key-file", keyFile}},
		{env: map[string]string{"ARAP_PEP_MASTER_KEY_FILE": keyFile}},
		{args: []string{"--config", write(t, "c", "master-key-file "+keyFile+"\n")}},
	} {
		s := newSettings(c.env)
		require.NoError(t, s.set.Parse(c.args))
		require.True(t, s.key.IsSet())
		require.Equal(t, "a2V5", s.key.Value())
	}

	err := newSettings(map[string]string{"ARAP_PEP_MASTER_KEY": "a2V5", "ARAP_PEP_MASTER_KEY_FILE": keyFile}).set.Parse(nil)
	require.EqualError(t, err, "the master key is set both in ARAP_PEP_MASTER_KEY and as a file (--master-key-file, ARAP_PEP_MASTER_KEY_FILE or the config file's master-key-file); set one")
	err = newSettings(map[string]string{"ARAP_PEP_MASTER_KEY_FILE": "/nonexistent"}).set.Parse(nil)
	require.ErrorContains(t, err, "the master key (--master-key-file): open /nonexistent")
	err = newSettings(nil).set.Parse([]string{"--master-key", "a2V5"})
	require.EqualError(t, err, "no such flag: --master-key", "never a flag")
	err = newSettings(nil).set.Parse([]string{"--master-key-file", write(t, "empty", "\n")})
	require.ErrorContains(t, err, "is empty")
}

// TestHelp lists every flag with its variable and config key, and every
// secret with where it may come from.
func TestHelp(t *testing.T) {
	s := newSettings(nil)
	require.ErrorIs(t, s.set.Parse([]string{"-h"}), config.ErrHelp)
	h := s.help.String()
	require.Contains(t, h, "usage: arapd test [flags]\n")
	require.Contains(t, h, "a flag wins over the variable, the variable over the file")
	require.Contains(t, h, "  --config FILE\n      read settings from FILE: one a line, its key (the flag name), a space, its value; # starts a comment\n      env ARAP_CONFIG\n")
	t.Log(h)
	require.Contains(t, h, "  --addr string\n      listen address (default 127.0.0.1:8481)\n      env ARAP_TEST_ADDR; config key addr\n")
	require.Contains(t, h, "  --exec-timeout duration\n      bound on a run (default 30s)\n      env ARAP_EXEC_TIMEOUT; config key exec-timeout\n")
	require.Contains(t, h, "  --local-passwords\n      allow passwords (default true)\n      env ARAP_LOCAL_PASSWORDS; config key local-passwords\n")
	require.Contains(t, h, "  the master key\n      env ARAP_PEP_MASTER_KEY, or a file: --master-key-file, env ARAP_PEP_MASTER_KEY_FILE, config key master-key-file\n")
	require.Contains(t, h, "  the PostgreSQL URL\n      env ARAP_DATABASE_URL or DATABASE_URL, or a file: --database-url-file, env ARAP_DATABASE_URL_FILE, config key database-url-file\n")
	require.NotContains(t, h, "--master-key-file string\n", "a secret's file flag is listed with its secret")
}

// TestSharedFile: commands reading one config file (arapctl's) can give a
// flag a key of its own, and skip the keys of the others; other unknown
// keys are still errors. Wrap leaves the command line to the caller.
func TestSharedFile(t *testing.T) {
	tokenFile := write(t, "token", "tok\n")
	file := write(t, "arapctl.conf", "url http://backend\nmcp-url http://mcp/mcp\nmcp-token-file "+tokenFile+"\ndatabase-url-file /elsewhere\n")
	fs := flag.NewFlagSet("arapctl mcp call", flag.ContinueOnError)
	c := config.Wrap(fs, "arapctl mcp call", io.Discard).WithLookup(func(string) (string, bool) { return "", false })
	endpoint := c.String("url", "http://127.0.0.1:8481/mcp", "MCP endpoint", "ARAP_MCP_URL")
	c.Key("url", "mcp-url")
	token := c.Secret("token", "the MCP caller's token", "ARAP_MCP_TOKEN")
	c.Key("token-file", "mcp-token-file")
	c.Ignore("url", "token-file", "database-url-file")
	require.NoError(t, fs.Parse([]string{"--config", file}))
	require.NoError(t, c.Resolve())
	require.Equal(t, "http://mcp/mcp", *endpoint, "its own key, not the API commands' url")
	require.Equal(t, "tok", token.Value())

	bad := write(t, "typo.conf", "mcp-url http://mcp/mcp\nmcp-urll x\n")
	fs = flag.NewFlagSet("arapctl mcp call", flag.ContinueOnError)
	c = config.Wrap(fs, "arapctl mcp call", io.Discard).WithLookup(func(string) (string, bool) { return "", false })
	c.String("url", "", "MCP endpoint", "ARAP_MCP_URL")
	c.Key("url", "mcp-url")
	c.Ignore("url")
	require.NoError(t, fs.Parse([]string{"--config", bad}))
	require.EqualError(t, c.Resolve(), bad+`:2: unknown key "mcp-urll"`)
}
