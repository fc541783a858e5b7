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
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/internal/contract"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/requests"
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

// TestTwoReplicasExpireOnce: two `arapd serve` replicas on one database
// sweep the same due requests at the same time, and every request expires
// exactly once (one request.expired event, one callback), some by each
// replica; then one replica is killed in the middle of its sweep
// transactions, and the other expires what it held, each request once.
//
// To have both sweeping at once rather than hope for it, the test holds the
// audit table (LOCK TABLE ... IN SHARE MODE) from before the deadline: a
// sweep then takes its batch of rows and waits at its audit insert, inside
// its transaction, keeping its worker. Due requests for one more
// transaction than a replica has sweep workers ensure that the other
// replica's sweep takes a batch too. The test waits until it sees each
// replica's sweep waiting (pg_stat_activity, by the application_name each
// replica connects with), then lets them all go.
func TestTwoReplicasExpireOnce(t *testing.T) {
	t.Parallel()
	env, policy, token, pool := setupDeployment(t)
	require.NoError(t, os.WriteFile(policy, []byte(e2ePolicy+scalePolicy), 0o600))
	args := []string{"serve", "--addr", "127.0.0.1:0", "--public-url", "https://arap.example", "--policy", policy}
	dbURL := strings.TrimPrefix(env[0], "DATABASE_URL=")
	replica := func(name string) *proc {
		sep := "?"
		if strings.Contains(dbURL, "?") {
			sep = "&"
		}
		// The later DATABASE_URL wins (os/exec keeps the last of duplicates).
		return startArapd(t, append(slices.Clone(env), "DATABASE_URL="+dbURL+sep+"application_name="+name), args...)
	}
	a, b := replica("replica-a"), replica("replica-b")
	ctx := context.Background()
	rc := newCallbackReceiver(t)
	templateID := submitTemplate(t, env, a, b, token, rc.URL)

	// holdAudit takes the audit table; the returned func lets it go.
	holdAudit := func() func() {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `LOCK TABLE arap.audit_events IN SHARE MODE`)
		require.NoError(t, err)
		return sync.OnceFunc(func() { require.NoError(t, tx.Rollback(ctx)) })
	}
	// waitingSweeps is which replicas have a sweep waiting at its audit
	// insert, with its batch of requests locked.
	waitingSweeps := func(c require.TestingT) map[string]int {
		rows, err := pool.Query(ctx, `SELECT application_name, count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%INSERT INTO arap.audit_events%' GROUP BY 1`)
		require.NoError(c, err)
		out := map[string]int{}
		for rows.Next() {
			var name string
			var n int
			require.NoError(c, rows.Scan(&name, &n))
			out[name] = n
		}
		require.NoError(c, rows.Err())
		return out
	}
	// expiredOnce checks that every request in ids expired, with one
	// request.expired audit event and one callback delivery each.
	expiredOnce := func(ids []string) {
		t.Helper()
		var expired, events, deliveries int
		require.NoError(t, pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM arap.requests WHERE id = ANY($1) AND status = 'expired'),
			(SELECT count(*) FROM (SELECT chain FROM arap.audit_events WHERE chain = ANY($1) AND kind = 'request.expired' GROUP BY chain HAVING count(*) = 1) x),
			(SELECT count(*) FROM (SELECT request_id FROM arap.deliveries WHERE request_id = ANY($1) AND event = 'expired' GROUP BY request_id HAVING count(*) = 1) y)`,
			ids).Scan(&expired, &events, &deliveries))
		require.Equal(t, len(ids), expired, "requests expired")
		require.Equal(t, len(ids), events, "requests with exactly one request.expired event")
		require.Equal(t, len(ids), deliveries, "requests with exactly one callback delivery")
	}
	pendingAmong := func(ids []string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM arap.requests WHERE id = ANY($1) AND status = 'pending'`, ids).Scan(&n))
		return n
	}

	// Round 1: both replicas sweep at once.
	n := (requests.MaintenanceWorkers+1)*requests.ExpireBatch + requests.ExpireBatch/2
	ids := insertPending(t, pool, templateID, n, time.Now().Add(3*time.Second))
	release := holdAudit()
	defer release()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		w := waitingSweeps(c)
		assert.Positive(c, w["replica-a"], "sweeps of replica a waiting with their batch")
		assert.Positive(c, w["replica-b"], "sweeps of replica b waiting with their batch")
	}, 90*time.Second, 100*time.Millisecond)
	t.Logf("sweeping at once: %v", waitingSweeps(t))
	release()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Zero(c, pendingAmong(ids), "requests still pending")
	}, 90*time.Second, 200*time.Millisecond)
	expiredOnce(ids)
	// Each replica logs what each of its sweep transactions expired.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, n, countLogged(a, 0, "requests expired")+countLogged(b, 0, "requests expired"))
	}, 30*time.Second, 50*time.Millisecond)
	byA, byB := countLogged(a, 0, "requests expired"), countLogged(b, 0, "requests expired")
	t.Logf("replica a expired %d, replica b %d", byA, byB)
	require.Positive(t, byA, "replica a expired some")
	require.Positive(t, byB, "replica b expired some")
	// Every callback arrives, one per request.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var open int
		require.NoError(c, pool.QueryRow(ctx, `SELECT count(*) FROM arap.deliveries WHERE request_id = ANY($1) AND status <> 'delivered'`, ids).Scan(&open))
		assert.Zero(c, open, "callbacks not delivered yet")
	}, 90*time.Second, 200*time.Millisecond)
	total, tasks := rc.counts()
	require.Equal(t, n, tasks, "a callback for every request")
	require.Equal(t, n, total, "and one each")

	// Round 2: a replica dies with its sweep transactions open; the other
	// expires their requests, once each. Whichever took a batch first (one
	// replica may take both) is the one killed.
	n2 := 2 * requests.ExpireBatch
	ids2 := insertPending(t, pool, templateID, n2, time.Now().Add(3*time.Second))
	release = holdAudit()
	defer release()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		w := waitingSweeps(c)
		assert.Positive(c, w["replica-a"]+w["replica-b"], "a sweep waiting with its batch")
	}, 90*time.Second, 100*time.Millisecond)
	victim, survivor := a, b
	if waitingSweeps(t)["replica-a"] == 0 {
		victim, survivor = b, a
	}
	mark := survivor.mark()
	require.NoError(t, victim.cmd.Process.Kill())
	victim.wait(10 * time.Second)
	release()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Zero(c, pendingAmong(ids2), "requests still pending")
	}, 120*time.Second, 200*time.Millisecond)
	expiredOnce(ids2)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, n2, countLogged(survivor, mark, "requests expired"), "the surviving replica expired them all")
	}, 30*time.Second, 50*time.Millisecond)
	require.NoError(t, survivor.alive())
	rep, err := audit.Verify(ctx, pool)
	require.NoError(t, err)
	require.True(t, rep.OK(), "audit chains break: %v", rep.Breaks)
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
