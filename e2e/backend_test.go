package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/contract"
	"github.com/omcp/arap/internal/dbtest"
)

const e2ePolicy = `version: 1
rules:
  - name: wire_transfer_large
    match: {action: tools/call, resource_type: mcp_tool, resource_id: wire_transfer}
    effect: request
    approval: {groups: [treasury]}
  - name: quick
    match: {action: tools/call, resource_type: mcp_tool, resource_id: quick}
    effect: request
    approval: {groups: [treasury]}
    request_ttl: 3s
`

func postJSON(t *testing.T, url, token string, body any, headers ...string) (int, map[string]any) {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequest("POST", url, bytes.NewReader(b))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	return resp.StatusCode, m
}

func toolCall(tool string, args map[string]any) map[string]any {
	return map[string]any{
		"subject":  map[string]any{"type": "user", "id": "alice", "properties": map[string]any{"act": map[string]any{"sub": "agent:demo"}}},
		"action":   map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": tool, "properties": map[string]any{"arguments": args}},
	}
}

// request evaluates call at evalURL and submits the request at submitURL.
func request(t *testing.T, evalURL, submitURL, token string, call map[string]any) string {
	t.Helper()
	status, d := postJSON(t, evalURL+"/access/v1/evaluation", token, call)
	require.Equal(t, 200, status, "%v", d)
	ctx := d["context"].(map[string]any)
	hint := ctx["access_request"].(map[string]any)
	body := map[string]any{}
	for k, v := range call {
		body[k] = v
	}
	body["denial"] = map[string]any{"expires_at": hint["expires_at"], "binding_token": hint["binding_token"], "evaluation_id": ctx["evaluation_id"]}
	status, r := postJSON(t, submitURL+"/access/v1/requests", token, body)
	require.Equal(t, 202, status, "%v", r)
	return r["task"].(map[string]any)["id"].(string)
}

func setupDeployment(t *testing.T) (env []string, policyFile, token string, pool *pgxpool.Pool) {
	t.Helper()
	dbURL := dbtest.URL(t)
	env = []string{"DATABASE_URL=" + dbURL, "ARAP_MASTER_KEY=" + masterKey}
	policyFile = filepath.Join(t.TempDir(), "policy.yaml")
	require.NoError(t, os.WriteFile(policyFile, []byte(e2ePolicy), 0o600))
	out := arapctl(t, env, "clients", "create", "--name", "pep", "--scope", "evaluate,request", "--actor", "agent:*",
		"--callback-prefix", "http://127.0.0.1:", "--callback-network", "loopback")
	token = regexp.MustCompile(`token: (\S+)`).FindStringSubmatch(out)[1]
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return env, policyFile, token, pool
}

// TestTwoReplicasExpireOnce runs two `arapd serve` processes on one database
// behind one public URL; requests go to either; one replica is killed with
// SIGKILL; every request still expires, exactly once.
func TestTwoReplicasExpireOnce(t *testing.T) {
	t.Parallel()
	env, policy, token, pool := setupDeployment(t)
	args := []string{"serve", "--addr", "127.0.0.1:0", "--public-url", "https://arap.example", "--policy", policy}
	a := startArapd(t, env, args...)
	b := startArapd(t, env, args...)
	// Each replica behind its own contract proxy (see internal/contract).
	apiA, apiB := contract.Proxy(t, a.url(), nil), contract.Proxy(t, b.url(), nil)

	const n = 20
	ids := make([]string, n)
	for i := range n {
		eval, sub := apiA, apiB
		if i%2 == 1 {
			eval, sub = apiB, apiA
		}
		ids[i] = request(t, eval, sub, token, toolCall("quick", map[string]any{"i": i}))
	}
	// One replica dies without warning; the other carries on.
	require.NoError(t, a.cmd.Process.Kill())
	a.wait(10 * time.Second)

	ctx := context.Background()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var pending int
		require.NoError(c, pool.QueryRow(ctx, `SELECT count(*) FROM arap.requests WHERE status = 'pending'`).Scan(&pending))
		assert.Zero(c, pending, "requests still pending")
	}, 90*time.Second, 200*time.Millisecond)
	for _, id := range ids {
		var status string
		var expiredEvents int
		require.NoError(t, pool.QueryRow(ctx, `SELECT status FROM arap.requests WHERE id = $1`, id).Scan(&status))
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM arap.audit_events WHERE chain = $1 AND kind = 'request.expired'`, id).Scan(&expiredEvents))
		require.Equal(t, "expired", status)
		require.Equal(t, 1, expiredEvents, "request %s expired exactly once", id)
	}
	_ = b
}

// TestReloadAndGracefulShutdown: SIGHUP reloads the policy, a bad file is
// refused with its line and the old policy stays; SIGTERM drains and exits 0.
func TestReloadAndGracefulShutdown(t *testing.T) {
	t.Parallel()
	env, policy, token, _ := setupDeployment(t)
	p := startArapd(t, env, "serve", "--addr", "127.0.0.1:0", "--policy", policy)
	api := contract.Proxy(t, p.url(), nil)
	decide := func() bool {
		status, d := postJSON(t, api+"/access/v1/evaluation", token, toolCall("wire_transfer", map[string]any{"amount": 50000}))
		require.Equal(t, 200, status)
		return d["decision"].(bool)
	}
	require.False(t, decide())

	require.NoError(t, os.WriteFile(policy, []byte("version: 1\nrules:\n  - name: broken\n    when: resource.id ==\n    effect: allow\n"), 0o600))
	p.signal(syscall.SIGHUP)
	rejected := p.waitLog("policy reload rejected; keeping the current policy", 30*time.Second)
	require.Contains(t, fmt.Sprint(rejected["error"]), "policy.yaml:4:")
	require.False(t, decide(), "the old policy is still in force")

	require.NoError(t, os.WriteFile(policy, []byte("version: 1\nrules:\n  - name: all\n    when: \"true\"\n    effect: allow\n"), 0o600))
	p.signal(syscall.SIGHUP)
	p.waitLog("policy reloaded", 30*time.Second)
	require.True(t, decide())

	p.signal(syscall.SIGTERM)
	require.Equal(t, 0, p.wait(40*time.Second))
	// Exited, so every line it wrote is collected (proc.done).
	p.waitLog("backend stopped", 30*time.Second)
	require.False(t, strings.Contains(strings.Join(p.logLines(), "\n"), token), "tokens never reach the logs")
}

// TestMigrateCommand runs `arapd migrate` twice on a fresh database.
func TestMigrateCommand(t *testing.T) {
	t.Parallel()
	dbURL := dbtest.URL(t)
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	defer pool.Close()
	_, err = pool.Exec(context.Background(), "DROP SCHEMA arap CASCADE; DROP SCHEMA pep CASCADE; DROP SCHEMA river CASCADE; DROP SCHEMA pep_river CASCADE; DROP TABLE public.arap_schema_migrations")
	require.NoError(t, err)
	for range 2 {
		cmd := exec(t, []string{"DATABASE_URL=" + dbURL}, "arapd", "migrate")
		require.NoError(t, cmd)
	}
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM arap.requests").Scan(&n))
}
