package upstream

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseGood(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "billing.token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("s3cret-file-token\n"), 0o600))
	t.Setenv("ARAP_TEST_GH_TOKEN", "s3cret-env-token")
	src := filepath.Join(dir, "upstreams.yaml")
	cfg, err := Parse(src, []byte(`
upstreams:
  - name: billing
    http:
      url: https://billing.internal.example/mcp
      headers: {X-Tenant: acme}
    credentials:
      file: billing.token
    prefix: billing.
    tools:
      include: ["get_*", "pay"]
      exclude: ["get_secret"]
      task_required: ["pay"]
    timeouts: {connect: 3s, call: 2m}
  - name: github
    stdio:
      command: bin/github-mcp-server
      args: [stdio]
      env: {GITHUB_HOST: github.com}
      dir: work
    credentials:
      env: ARAP_TEST_GH_TOKEN
      as_env: GITHUB_PERSONAL_ACCESS_TOKEN
    relist: 30s
`))
	require.NoError(t, err)
	require.Len(t, cfg.Upstreams, 2)
	b, g := cfg.Upstreams[0], cfg.Upstreams[1]
	require.Equal(t, "billing", b.Name)
	require.Equal(t, "Authorization", b.Credentials.Header)
	require.Equal(t, "Bearer s3cret-file-token", b.Credentials.headerValue())
	require.Equal(t, 3*time.Second, b.Connect)
	require.Equal(t, 2*time.Minute, b.Call)
	require.Equal(t, DefaultRelist, b.Relist)
	name, ok := b.exposes("get_invoice")
	require.True(t, ok)
	require.Equal(t, "billing.get_invoice", name)
	_, ok = b.exposes("get_secret")
	require.False(t, ok, "exclude applies after include")
	_, ok = b.exposes("delete_all")
	require.False(t, ok, "include limits the tools offered")
	require.True(t, b.taskRequired("pay"))
	require.False(t, b.taskRequired("get_invoice"))

	require.Equal(t, filepath.Join(dir, "work"), g.Stdio.Dir, "relative dir is relative to the file")
	require.Equal(t, filepath.Join(dir, "bin/github-mcp-server"), g.Stdio.Command, "so is a relative command path")
	require.Equal(t, "GITHUB_PERSONAL_ACCESS_TOKEN", g.Credentials.AsEnv)
	require.Equal(t, "s3cret-env-token", secretOf(g.Credentials))
	require.Equal(t, DefaultCallTimeout, g.Call)
	require.Equal(t, 30*time.Second, g.Relist)

	// The secret is never printed, however the config is formatted.
	for _, f := range []string{"%v", "%+v", "%#v", "%s"} {
		out := fmt.Sprintf(f, cfg) + fmt.Sprintf(f, *cfg) + fmt.Sprintf(f, b) + fmt.Sprintf(f, b.Credentials) + fmt.Sprintf(f, *g.Credentials)
		require.NotContains(t, out, "s3cret", f)
	}
}

func TestParseEmpty(t *testing.T) {
	cfg, err := Parse("empty.yaml", nil)
	require.NoError(t, err)
	require.Empty(t, cfg.Upstreams)
}

func TestParseErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.token")
	require.NoError(t, os.WriteFile(empty, []byte("\n"), 0o600))
	t.Setenv("ARAP_TEST_SECRET", "topsecret-value")
	for _, tc := range []struct {
		name, doc string
		line      int
		reason    string
	}{
		{"unknown top key", "upstream:\n  - name: a\n", 1, "field upstream not found"},
		{"unknown entry key", "upstreams:\n  - name: a\n    stdio: {command: x}\n    prefx: a.\n", 4, "field prefx not found"},
		{"bad yaml", "upstreams: [\n", 1, "did not find expected"},
		{"no name", "upstreams:\n  - stdio: {command: x}\n", 2, "name \"\" must be"},
		{"bad name", "upstreams:\n  - name: Files\n    stdio: {command: x}\n", 2, "name \"Files\" must be"},
		{"duplicate name", "upstreams:\n  - name: a\n    stdio: {command: x}\n  - name: a\n    stdio: {command: y}\n", 4, "defined twice (first at line 2)"},
		{"no transport", "upstreams:\n  - name: a\n", 2, "needs a transport"},
		{"both transports", "upstreams:\n  - name: a\n    http: {url: 'http://h/mcp'}\n    stdio:\n      command: x\n", 4, "both http and stdio"},
		{"bad scheme", "upstreams:\n  - name: a\n    http:\n      url: ftp://h/mcp\n", 4, "http or https"},
		{"userinfo in url", "upstreams:\n  - name: a\n    http:\n      url: https://u:topsecret-value@h/mcp\n", 4, "must not carry credentials"},
		{"reserved header", "upstreams:\n  - name: a\n    http:\n      url: https://h/mcp\n      headers:\n        Mcp-Session-Id: x\n", 6, "set by the MCP transport"},
		{"bad header name", "upstreams:\n  - name: a\n    http:\n      url: https://h/mcp\n      headers:\n        \"bad header\": x\n", 6, "not a valid HTTP header name"},
		{"no command", "upstreams:\n  - name: a\n    stdio:\n      args: [x]\n", 3, "stdio.command is required"},
		{"bad env name", "upstreams:\n  - name: a\n    stdio:\n      command: x\n      env:\n        \"A-B\": x\n", 6, "not a valid environment variable"},
		{"bad prefix", "upstreams:\n  - name: a\n    stdio: {command: x}\n    prefix: \"fs/\"\n", 4, "not allowed in MCP tool names ('/')"},
		{"long prefix", "upstreams:\n  - name: a\n    stdio: {command: x}\n    prefix: " + strings.Repeat("p", 128) + "\n", 4, "exposed tool names are at most 128"},
		{"bad glob", "upstreams:\n  - name: a\n    stdio: {command: x}\n    tools:\n      include: [\"[\"]\n", 5, "not a valid glob"},
		{"bad duration", "upstreams:\n  - name: a\n    stdio: {command: x}\n    timeouts:\n      call: forever\n", 5, "timeouts.call \"forever\" is not a positive duration"},
		{"negative duration", "upstreams:\n  - name: a\n    stdio: {command: x}\n    timeouts:\n      connect: -1s\n", 5, "timeouts.connect"},
		{"missing credentials file", "upstreams:\n  - name: a\n    http: {url: 'https://h/mcp'}\n    credentials:\n      file: nope.token\n", 5, "credentials file \"nope.token\" cannot be read: no such file"},
		{"empty credentials file", "upstreams:\n  - name: a\n    http: {url: 'https://h/mcp'}\n    credentials:\n      file: " + empty + "\n", 5, "is empty"},
		{"missing env", "upstreams:\n  - name: a\n    http: {url: 'https://h/mcp'}\n    credentials:\n      env: ARAP_TEST_UNSET_VAR\n", 5, "ARAP_TEST_UNSET_VAR is not set"},
		{"file and env", "upstreams:\n  - name: a\n    http: {url: 'https://h/mcp'}\n    credentials:\n      env: ARAP_TEST_SECRET\n      file: x\n", 4, "exactly one of file and env"},
		{"stdio without as_env", "upstreams:\n  - name: a\n    stdio: {command: x}\n    credentials:\n      env: ARAP_TEST_SECRET\n", 4, "as_env must name"},
		{"header twice", "upstreams:\n  - name: a\n    http:\n      url: 'https://h/mcp'\n      headers: {x-api-key: topsecret-value}\n    credentials:\n      env: ARAP_TEST_SECRET\n      header: X-Api-Key\n", 5, "set both in http.headers and by credentials"},
		{"credential as a plain header", "upstreams:\n  - name: a\n    http:\n      url: 'https://h/mcp'\n      headers:\n        authorization: Bearer topsecret-value\n", 6, "carries a credential: give it in credentials"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := filepath.Join(dir, "upstreams.yaml")
			_, err := Parse(src, []byte(tc.doc))
			require.Error(t, err)
			var ce *ConfigError
			require.ErrorAs(t, err, &ce)
			require.Contains(t, err.Error(), fmt.Sprintf("%s:%d: ", src, tc.line))
			require.Contains(t, err.Error(), tc.reason)
			require.NotContains(t, err.Error(), "topsecret-value", "a credential never appears in an error")
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	require.ErrorContains(t, err, "nope.yaml")
	require.ErrorContains(t, err, "no such file")
}
