package pep_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/pep"
)

// gated is the real MCP server in front of a real backend (dev seed policy),
// with the gate's limits set by cfg.
type gated struct {
	url     string
	backend *pgxpool.Pool
	pep     *pgxpool.Pool
}

func gatedServer(t *testing.T, maxPending, perMinute int) *gated {
	t.Helper()
	env := backendtest.Start(t, backendtest.Options{})
	db := dbtest.New(t)
	g, err := pep.NewGate(pep.Config{DB: db, Backend: &arapclient.Client{BaseURL: env.URL, Token: dev.PEPToken},
		MasterKey: make([]byte, 32), Tools: pep.DemoTools(), MaxPending: maxPending, SubmitsPerMinute: perMinute})
	require.NoError(t, err)
	require.NoError(t, g.Callers().Create(context.Background(), "alice-agent", "alice-token-0123", pep.Principal{SubjectType: "user", SubjectID: "alice", ActorID: "agent:demo"}))
	srv, err := pep.NewServer(g, pep.ServerOptions{Name: "test", Version: "0", RequestsPerMinute: 100000})
	require.NoError(t, err)
	h := httptest.NewServer(srv)
	t.Cleanup(h.Close)
	return &gated{url: h.URL + pep.PathMCP, backend: env.Pool, pep: db}
}

// transfer calls wire_transfer (requestable over 25000) with the tasks
// extension declared, and returns the JSON-RPC result.
func (s *gated) transfer(t *testing.T, amount int) map[string]any {
	t.Helper()
	status, body := sendTasks(t, s.url, "tools/call", fmt.Sprintf(`{"name":"wire_transfer","arguments":{"to":"acct-limits","amount":%d}}`, amount))
	require.Equal(t, 200, status, body)
	var resp struct {
		Result map[string]any `json:"result"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &resp), body)
	require.NotNil(t, resp.Result, body)
	return resp.Result
}

func (s *gated) pendingRequests(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, s.backend.QueryRow(context.Background(), `SELECT count(*) FROM arap.requests WHERE status = 'pending'`).Scan(&n))
	return n
}

// sendTasks sends one request as alice, declaring the tasks extension.
func sendTasks(t *testing.T, url, method, params string) (int, string) {
	t.Helper()
	var p map[string]any
	require.NoError(t, json.Unmarshal([]byte(params), &p))
	p["_meta"] = map[string]any{"io.modelcontextprotocol/protocolVersion": "2026-07-28",
		"io.modelcontextprotocol/clientCapabilities": map[string]any{"extensions": map[string]any{"io.modelcontextprotocol/tasks": map[string]any{}}}}
	raw, err := json.Marshal(p)
	require.NoError(t, err)
	return sendRaw(t, url, "Bearer alice-token-0123", method, string(raw))
}

// outcome sorts a tools/call result: a task, a limit denial, or other.
func outcome(res map[string]any) string {
	if res["resultType"] == "task" {
		return "task"
	}
	raw, _ := json.Marshal(res)
	if res["isError"] == true && strings.Contains(string(raw), "Too many approval requests") &&
		strings.Contains(string(raw), `"remediation":"unavailable"`) {
		return "limited"
	}
	return "other: " + string(raw)
}

// concurrently makes n gated calls at once, with distinct arguments, and
// counts the outcomes.
func (s *gated) concurrently(t *testing.T, n int) map[string]int {
	t.Helper()
	results := make([]map[string]any, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = s.transfer(t, 26000+i)
		}()
	}
	wg.Wait()
	counts := map[string]int{}
	for _, r := range results {
		counts[outcome(r)]++
	}
	return counts
}

// TestLimitsHoldUnderConcurrency: a principal's live approval tasks and its
// submissions per minute are checked and taken in one step, so 100
// concurrent gated calls from a fresh principal open exactly the limit's
// number of tasks and backend requests; every other call gets the
// non-requestable limit denial.
func TestLimitsHoldUnderConcurrency(t *testing.T) {
	t.Parallel()
	t.Run("live tasks", func(t *testing.T) {
		t.Parallel()
		s := gatedServer(t, 20, 1000)
		counts := s.concurrently(t, 100)
		require.Equal(t, map[string]int{"task": 20, "limited": 80}, counts)
		require.Equal(t, 20, s.pendingRequests(t), "requests at the backend")
		var intents int
		require.NoError(t, s.pep.QueryRow(context.Background(), `SELECT count(*) FROM pep.intents`).Scan(&intents))
		require.Equal(t, 20, intents, "no intent written for a call over the limit")
	})
	t.Run("submissions per minute", func(t *testing.T) {
		t.Parallel()
		s := gatedServer(t, 1000, 15)
		counts := s.concurrently(t, 100)
		require.Equal(t, map[string]int{"task": 15, "limited": 85}, counts)
		require.Equal(t, 15, s.pendingRequests(t), "requests at the backend")
	})
}

// TestLimitCheckWaitsForAnOpeningInFlight: the limits are counted under
// the principal's limit lock, so a call made while another opening of the
// same principal is in flight (its task inserted, not yet committed) waits
// for it and counts it: at one live task at most, it is refused.
func TestLimitCheckWaitsForAnOpeningInFlight(t *testing.T) {
	t.Parallel()
	s := gatedServer(t, 1, 1000)
	ctx := context.Background()
	tx, err := s.pep.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	const principal = "user:alice|agent:demo"
	_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, pep.LockLimits, principal)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO pep.tasks (id, principal, kind, status, created_at, updated_at, poll_interval_ms)
		VALUES ('tsk_in_flight', $1, $2, 'working', now(), now(), 1000)`, principal, pep.KindApproval)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO pep.approval_tasks (task_id, tool, args_sealed, args_digest, principal, dedup_key, phase, generation, created_at, updated_at)
		VALUES ('tsk_in_flight', 'wire_transfer', '\x00', 'd', $1, 'in-flight', 'submitting', 1, now(), now())`, principal)
	require.NoError(t, err)

	// The opening in flight commits once the call waits for its lock (or
	// after 30 s without a waiter).
	waited, committed := make(chan bool, 1), make(chan error, 1)
	go func() {
		ok := false
		for deadline := time.Now().Add(30 * time.Second); !ok && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) { // polling
			var n int
			if err := s.pep.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
				WHERE d.datname = current_database() AND l.locktype = 'advisory' AND NOT l.granted`).Scan(&n); err != nil {
				break
			}
			ok = n > 0
		}
		waited <- ok
		committed <- tx.Commit(ctx)
	}()
	r := s.transfer(t, 26000)
	require.True(t, <-waited, "the call waited for the opening in flight")
	require.NoError(t, <-committed)
	require.Equal(t, "limited", outcome(r), "the opening in flight counted: %v", r)
}

// TestDedupBeforeLimits: at the cap, a repeat of a pending call returns
// its existing task (it asks for nothing new), while a new call is refused,
// before it is asked for input.
func TestDedupBeforeLimits(t *testing.T) {
	t.Parallel()
	s := gatedServer(t, 3, 1000)
	var first string
	for i := range 3 {
		r := s.transfer(t, 30000+i)
		require.Equal(t, "task", r["resultType"], r)
		if i == 0 {
			first = r["taskId"].(string)
		}
	}
	require.Equal(t, "limited", outcome(s.transfer(t, 40000)), "a new call at the cap")
	r := s.transfer(t, 30000)
	require.Equal(t, "task", r["resultType"], "a repeat of a pending call at the cap: %v", r)
	require.Equal(t, first, r["taskId"])
	require.Equal(t, 3, s.pendingRequests(t))

	// A call that would need input first is refused before any is asked:
	// the answer could not be used.
	status, body := sendTasks(t, s.url, "tools/call", `{"name":"read_customer_record","arguments":{"customer_id":"c-1"}}`)
	require.Equal(t, 200, status, body)
	var resp struct {
		Result map[string]any `json:"result"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &resp), body)
	require.Equal(t, "limited", outcome(resp.Result), "no input_required at the cap")
}
