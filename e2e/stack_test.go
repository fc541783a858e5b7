package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/contract"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/mcp/tasks"
)

var pepMasterKey = base64.StdEncoding.EncodeToString([]byte("e2e-pep-master-key-0123456789ab!"))

// stack is a backend and an MCP front-end, as separate processes on one
// database, set up the way an operator would with arapd and arapctl.
type stack struct {
	t         *testing.T
	dbURL     string
	env       []string
	pool      *pgxpool.Pool
	backend   *proc
	api       string // the backend's public URL: a proxy that checks every response against openapi/arap.yaml
	mcp       *proc
	pepToken  string
	itsmToken string
	secret    string
	alice     string // MCP caller: alice through agent:demo
	mallory   string // MCP caller: mallory through agent:demo
	mcpBinary string
	mcpArgs   []string
	mcpEnv    []string
}

type stackOptions struct {
	policy    string   // default: the dev seed policy
	mcpBinary string   // default: the arapd this test binary built
	mcpArgs   []string // more flags for arapd mcp
	mcpEnv    []string // more environment for arapd mcp
	dbURL     string   // default: a fresh database of the shared test cluster
}

func token(out string) string { return regexp.MustCompile(`token: (\S+)`).FindStringSubmatch(out)[1] }

func newStack(t *testing.T, o stackOptions) *stack {
	t.Helper()
	s := &stack{t: t, dbURL: o.dbURL, mcpBinary: o.mcpBinary, mcpArgs: o.mcpArgs, mcpEnv: o.mcpEnv}
	if s.dbURL == "" {
		s.dbURL = dbtest.URL(t)
	}
	s.env = []string{"DATABASE_URL=" + s.dbURL, "ARAP_MASTER_KEY=" + masterKey}
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	doc := o.policy
	if doc == "" {
		doc = string(dev.SeedPolicy())
	}
	require.NoError(t, os.WriteFile(policy, []byte(doc), 0o600))
	s.pepToken = token(arapctl(t, s.env, "clients", "create", "--name", "pep", "--scope", "evaluate,request", "--actor", "agent:*",
		"--callback-prefix", "http://127.0.0.1:", "--callback-network", "loopback"))
	s.itsmToken = token(arapctl(t, s.env, "clients", "create", "--name", "itsm", "--scope", "decide", "--kind", "itsm"))
	s.alice = token(arapctl(t, s.env, "callers", "create", "alice-agent", "--subject", "alice", "--actor", "agent:demo"))
	s.mallory = token(arapctl(t, s.env, "callers", "create", "mallory-agent", "--subject", "mallory", "--actor", "agent:demo"))
	front := httptest.NewUnstartedServer(nil)
	s.api = "http://" + front.Listener.Addr().String()
	s.backend = startArapd(t, s.env, "serve", "--addr", "127.0.0.1:0", "--policy", policy, "--public-url", s.api)
	contract.Proxy(t, s.backend.url(), front)
	s.secret = regexp.MustCompile(`(whsec_\S+)`).FindStringSubmatch(arapctl(t, s.env, "clients", "secret", "rotate", "pep"))[1]
	s.mcp = s.startMCP()
	var err error
	s.pool, err = pgxpool.New(context.Background(), s.dbURL)
	require.NoError(t, err)
	t.Cleanup(s.pool.Close)
	return s
}

// startMCP starts `arapd mcp` with short timers, plus extra environment.
// The execution timeout (30 s) and the intent grace (15 s) stay the
// defaults: on a loaded machine a tool run, or a submission, may be slow,
// and a run slower than the timeout ends outcome-unknown; a submission
// slower than the grace is taken over by the reconciler (see
// startRecoveryMCP).
func (s *stack) startMCP(extraEnv ...string) *proc {
	env := append([]string{
		"DATABASE_URL=" + s.dbURL, "ARAP_PEP_MASTER_KEY=" + pepMasterKey, "ARAP_BACKEND_TOKEN=" + s.pepToken,
		"ARAP_WEBHOOK_SECRETS=" + s.secret,
	}, slices.Concat(s.mcpEnv, extraEnv)...)
	addr := "127.0.0.1:0"
	if s.mcp != nil {
		addr = s.mcp.addr // a restart keeps the address the backend calls back
	}
	args := []string{"mcp", "--addr", addr, "--backend-url", s.api, "--demo-tools",
		"--poll-interval", "500ms", "--reconcile-every", reconcileEvery.String()}
	args = append(args, s.mcpArgs...)
	if s.mcpBinary != "" {
		return startBinary(s.t, s.mcpBinary, env, args...)
	}
	return startArapd(s.t, env, args...)
}

// startFaultyMCP starts `arapd mcp` that kills itself (SIGKILL) at fault
// point, with a two-second execution timeout: a run it claims and dies in
// is reaped (outcome-unknown) two seconds after the claim, by whichever
// front-end runs next.
func (s *stack) startFaultyMCP(point string) *proc {
	return s.startMCP("ARAP_FAULT="+point, "ARAP_EXEC_TIMEOUT=2s")
}

// startRecoveryMCP starts `arapd mcp` after one died in the middle of a
// call, with an intent grace of a second: the submission intent the dead
// one left unbound is taken over a second later, not fifteen. (Only for
// recovering: a live submission slower than the grace would be taken over
// too.)
func (s *stack) startRecoveryMCP() *proc {
	return s.startMCP("ARAP_INTENT_GRACE=1s")
}

func (s *stack) client(token string) *tasks.Client {
	return &tasks.Client{URL: s.mcp.url() + "/mcp", Token: token}
}

// pendingRequests lists the backend's pending request ids.
func (s *stack) pendingRequests() []string {
	rows, err := s.pool.Query(context.Background(), `SELECT id FROM arap.requests WHERE status = 'pending' ORDER BY created_at`)
	require.NoError(s.t, err)
	var ids []string
	for rows.Next() {
		var id string
		require.NoError(s.t, rows.Scan(&id))
		ids = append(ids, id)
	}
	return ids
}

// decide approves or denies a backend request as the ITSM client.
func (s *stack) decide(id, decision string) int {
	status, _ := postJSON(s.t, s.api+"/v1/requests/"+id+"/decisions", s.itsmToken, map[string]any{"decision": decision, "reason": "e2e"})
	return status
}

// requestOf is the backend request currently bound to an MCP task.
func (s *stack) requestOf(taskID string) string {
	var id *string
	require.Eventually(s.t, func() bool {
		err := s.pool.QueryRow(context.Background(), `SELECT backend_id FROM pep.approval_tasks WHERE task_id = $1`, taskID).Scan(&id)
		return err == nil && id != nil
	}, 30*time.Second, 50*time.Millisecond)
	return *id
}

// ledger counts executions of a task's tool.
func (s *stack) ledger(taskID string) int {
	n, err := s.ledgerCount(taskID)
	require.NoError(s.t, err)
	return n
}

// ledgerCount is ledger for a condition of Eventually or Never, which runs
// on a goroutine of its own (where require must not stop the test).
func (s *stack) ledgerCount(taskID string) (int, error) {
	var n int
	err := s.pool.QueryRow(context.Background(), `SELECT count(*) FROM pep.ledger WHERE task_id = $1`, taskID).Scan(&n)
	return n, err
}

// callbacksSettled waits until the backend has finished every callback
// delivery of the task's requests (every generation): each one answered by
// the front-end, or given up. The front-end answers a callback after it
// has looked at the task, so from then on no wake-up is on its way.
func (s *stack) callbacksSettled(taskID string) {
	s.t.Helper()
	require.EventuallyWithT(s.t, func(c *assert.CollectT) {
		var pending int
		require.NoError(c, s.pool.QueryRow(context.Background(), `SELECT count(*) FROM arap.deliveries d
			JOIN pep.intents i ON i.backend_id = d.request_id WHERE i.task_id = $1 AND d.status = 'pending'`, taskID).Scan(&pending))
		assert.Zero(c, pending, "callbacks of task %s still being delivered", taskID)
	}, 60*time.Second, 50*time.Millisecond)
}

// reconcileEvery is the front-end's reconciler period in these stacks.
const reconcileEvery = time.Second

// nothingMoreRuns checks that ended tasks never run their tool again:
// executed maps each task to the executions its ledger holds. See
// nothingMoreHappens for what it waits for.
func (s *stack) nothingMoreRuns(executed map[string]int) {
	s.t.Helper()
	ids := make([]string, 0, len(executed))
	for id := range executed {
		ids = append(ids, id)
	}
	s.nothingMoreHappens(ids, func() error {
		for id, n := range executed {
			got, err := s.ledgerCount(id)
			if err != nil {
				return err
			}
			if got != n {
				return fmt.Errorf("task %s: its ledger went from %d rows to %d after it ended", id, n, got)
			}
		}
		return nil
	})
}

// nothingMoreHappens is nothingMoreRuns for tools whose effects the test
// observes itself (an upstream's): changed reports an effect that differs
// from what the ended tasks ids left. It waits for the events after which
// nothing could still act on them, instead of watching a window:
//   - callbacks: every delivery of their requests answered (callbacksSettled);
//   - the look sweep: their looks are brought forward, as if due long ago,
//     ahead of a canary's, and a sweep has since looked at the canary (it
//     takes due tasks oldest first), passing over them;
//   - the reconciler: it takes only intents left open (or abandoned, which
//     it only settles), and none of theirs is open.
func (s *stack) nothingMoreHappens(ids []string, changed func() error) {
	s.t.Helper()
	ctx := context.Background()
	for _, id := range ids {
		s.callbacksSettled(id)
	}
	const longAgo = "2000-01-01T00:00:00Z"
	_, err := s.pool.Exec(ctx, `UPDATE pep.approval_tasks SET look_at = $2 WHERE task_id = ANY($1)`, ids, longAgo)
	require.NoError(s.t, err)
	canary := s.lookCanary(ids[0])
	require.Eventually(s.t, func() bool {
		var looked bool
		err := s.pool.QueryRow(ctx, `SELECT look_at = deadline FROM pep.approval_tasks WHERE task_id = $1`, canary).Scan(&looked)
		return err == nil && looked
	}, 60*time.Second, 20*time.Millisecond, "no sweep looked at the canary")
	var taken []string
	require.NoError(s.t, s.pool.QueryRow(ctx, `SELECT coalesce(array_agg(task_id), '{}') FROM pep.approval_tasks
		WHERE task_id = ANY($1) AND look_at IS DISTINCT FROM $2`, ids, longAgo).Scan(&taken))
	require.Empty(s.t, taken, "the sweep took ended tasks")
	var open []string
	require.NoError(s.t, s.pool.QueryRow(ctx, `SELECT coalesce(array_agg(task_id), '{}') FROM pep.intents
		WHERE task_id = ANY($1) AND state = 'intent'`, ids).Scan(&open))
	require.Empty(s.t, open, "ended tasks with an intent the reconciler would bind")
	require.NoError(s.t, changed(), "an ended task's effects changed")
}

// lookCanary adds a task (a copy of task like, whose rows give every
// column a valid value) that waits for input until a day from now, its
// look due now but later than anything brought forward to the past: a
// look at it, once done, schedules the next one at that deadline. It is
// deleted at the end of the test.
func (s *stack) lookCanary(like string) string {
	s.t.Helper()
	ctx := context.Background()
	id := tasks.NewID()
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		for _, q := range []struct {
			sql  string
			args []any
		}{
			{`CREATE TEMP TABLE canary_task ON COMMIT DROP AS SELECT * FROM pep.tasks WHERE id = $1`, []any{like}},
			{`UPDATE canary_task SET id = $1, status = 'input_required', updated_at = now()`, []any{id}},
			{`INSERT INTO pep.tasks SELECT * FROM canary_task`, nil},
			{`CREATE TEMP TABLE canary_approval ON COMMIT DROP AS SELECT * FROM pep.approval_tasks WHERE task_id = $1`, []any{like}},
			{`UPDATE canary_approval SET task_id = $1, dedup_key = $1, phase = 'input', disposition = NULL,
				claimed_at = NULL, exec_deadline = NULL, deadline = now() + interval '1 day', look_at = now()`, []any{id}},
			{`INSERT INTO pep.approval_tasks SELECT * FROM canary_approval`, nil},
		} {
			if _, err := tx.Exec(ctx, q.sql, q.args...); err != nil {
				return fmt.Errorf("look canary: %s: %w", q.sql, err)
			}
		}
		return nil
	})
	require.NoError(s.t, err)
	s.t.Cleanup(func() { _, _ = s.pool.Exec(context.Background(), `DELETE FROM pep.tasks WHERE id = $1`, id) })
	return id
}

// deliveryAnswered waits until callback delivery id has more than after
// attempts recorded, each one an answer of the receiver (or the failure to
// reach it), and returns their number. The receiver answers before the
// backend records the answer, so a delivery seen to arrive may not be
// recorded yet.
func (s *stack) deliveryAnswered(id string, after int) int {
	s.t.Helper()
	var attempts int
	require.EventuallyWithT(s.t, func(c *assert.CollectT) {
		require.NoError(c, s.pool.QueryRow(context.Background(), `SELECT count(*) FROM arap.delivery_attempts WHERE delivery_id = $1`, id).Scan(&attempts))
		assert.Greater(c, attempts, after, "delivery %s", id)
	}, 60*time.Second, 50*time.Millisecond)
	return attempts
}

// waitTask polls until the task is terminal.
func (s *stack) waitTask(c *tasks.Client, id string) *tasks.Detailed {
	s.t.Helper()
	return s.waitTaskWithin(c, id, 60*time.Second)
}

// waitTaskWithin is waitTask with its own bound, for a task that must not
// need a safety poll (pep.SafetyPoll) to end.
func (s *stack) waitTaskWithin(c *tasks.Client, id string, d time.Duration) *tasks.Detailed {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	task, err := c.Wait(ctx, id)
	require.NoError(s.t, err)
	return task
}
