package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/mcp/tasks"
)

// TestTaskAccessAndProtocol covers who may touch a task, capability gating,
// authentication, headers, deduplication under concurrency, limits,
// notifications, and what is stored and logged.
func TestTaskAccessAndProtocol(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{})
	ctx := context.Background()
	alice, mallory := s.client(s.alice), s.client(s.mallory)

	r, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-secret-991", "amount": 50000}, nil)
	require.NoError(t, err)
	id := r.Task.TaskID

	t.Run("another principal cannot read, update or cancel the task", func(t *testing.T) {
		_, _, err := mallory.Get(ctx, id)
		requireRPC(t, err, -32602, "not found")
		requireRPC(t, mallory.Cancel(ctx, id), -32602, "not found")
		requireRPC(t, mallory.Update(ctx, id, map[string]any{"x": map[string]any{"action": "accept"}}), -32602, "not found")
		d, _, err := alice.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, tasks.Working, d.Status, "mallory's cancel changed nothing")
		_, _, err = alice.Get(ctx, "tsk_UNKNOWN")
		requireRPC(t, err, -32602, "not found")
	})

	t.Run("tasks methods need the capability on the request", func(t *testing.T) {
		noTasks := s.client(s.alice)
		noTasks.NoTasks = true
		_, _, err := noTasks.Get(ctx, id)
		requireRPC(t, err, -32021, "Missing required client capability")
	})

	t.Run("without tasks: a degraded result, or -32021 for a task-required tool", func(t *testing.T) {
		noTasks := s.client(s.alice)
		noTasks.NoTasks = true
		before := len(s.pendingRequests())
		res, err := noTasks.CallTool(ctx, "wire_transfer", map[string]any{"to": "x", "amount": 90000}, nil)
		require.NoError(t, err)
		require.True(t, res.IsError)
		require.Contains(t, string(res.Raw), "did not run")
		require.Contains(t, string(res.Raw), `"remediation":"undisclosed"`)
		require.Equal(t, before, len(s.pendingRequests()), "nothing submitted on the degraded path")
		_, err = noTasks.CallTool(ctx, "delete_repository", map[string]any{"repo": "payments"}, nil)
		requireRPC(t, err, -32021, "Missing required client capability")
		require.Contains(t, string(err.(*tasks.RPCError).Data), "io.modelcontextprotocol/tasks")
	})

	t.Run("plain denials and allowed calls", func(t *testing.T) {
		res, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "x", "amount": 5000000}, nil)
		require.NoError(t, err)
		require.True(t, res.IsError)
		require.Contains(t, string(res.Raw), `"remediation":"unavailable"`)
		res, err = alice.CallTool(ctx, "get_balance", map[string]any{}, nil)
		require.NoError(t, err)
		require.False(t, res.IsError)
		require.Contains(t, string(res.Raw), "Balance")
		_, err = alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "x", "amount": "lots"}, nil)
		requireRPC(t, err, -32602, "invalid arguments")
	})

	t.Run("authentication and headers", func(t *testing.T) {
		anon := s.client("")
		resp, err := anon.Call(ctx, "tools/list", "", nil)
		require.Error(t, err)
		_ = resp
		req, _ := http.NewRequest("POST", s.mcp.url()+"/mcp", strings.NewReader(`{}`))
		hr, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		hr.Body.Close()
		require.Equal(t, 401, hr.StatusCode)
		require.Contains(t, hr.Header.Get("WWW-Authenticate"), "Bearer")
		bad := s.client("not-a-token-at-all")
		_, err = bad.Call(ctx, "tools/list", "", nil)
		require.Error(t, err)

		// Mcp-Name must be the taskId for tasks/*.
		resp, err = alice.Call(ctx, tasks.MethodGet, "tsk_other", map[string]any{"taskId": id})
		require.NoError(t, err)
		require.Equal(t, 400, resp.HTTPStatus)
		require.Equal(t, -32020, resp.Error.Code)
	})

	t.Run("concurrent identical calls open one approval", func(t *testing.T) {
		args := map[string]any{"to": "acct-dup", "amount": 33333}
		ids := make([]string, 10)
		var wg sync.WaitGroup
		for i := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := alice.CallTool(ctx, "wire_transfer", args, nil)
				if err == nil && r.Task != nil {
					ids[i] = r.Task.TaskID
				}
			}()
		}
		wg.Wait()
		for _, x := range ids {
			require.Equal(t, ids[0], x)
		}
		var n int
		require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*) FROM arap.requests WHERE resource->'properties'->'arguments'->>'to' = 'acct-dup'`).Scan(&n))
		require.Equal(t, 1, n)
	})

	t.Run("task notifications on subscriptions/listen", func(t *testing.T) {
		r, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-listen", "amount": 45000}, nil)
		require.NoError(t, err)
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 77, "method": "subscriptions/listen", "params": map[string]any{
			"notifications": map[string]any{"taskIds": []string{r.Task.TaskID, id, "tsk_not_mine"}},
			"_meta": map[string]any{"io.modelcontextprotocol/protocolVersion": "2026-07-28",
				"io.modelcontextprotocol/clientCapabilities": map[string]any{"extensions": map[string]any{"io.modelcontextprotocol/tasks": map[string]any{}}}}}})
		req, _ := http.NewRequest("POST", s.mcp.url()+"/mcp", strings.NewReader(string(body)))
		req.Header.Set("Authorization", "Bearer "+s.alice)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
		req.Header.Set("Mcp-Method", "subscriptions/listen")
		lctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		resp, err := http.DefaultClient.Do(req.WithContext(lctx))
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
		events := make(chan map[string]any, 16)
		go func() {
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
					var m map[string]any
					_ = json.Unmarshal([]byte(d), &m)
					events <- m
				}
			}
			close(events)
		}()
		ack := <-events
		require.Equal(t, "notifications/subscriptions/acknowledged", ack["method"])
		acked := ack["params"].(map[string]any)["notifications"].(map[string]any)["taskIds"].([]any)
		require.ElementsMatch(t, []any{r.Task.TaskID, id}, acked, "only the caller's own tasks")
		require.Equal(t, 200, s.decide(s.requestOf(r.Task.TaskID), "approve"))
		for ev := range events {
			if ev["method"] == "notifications/tasks" {
				p := ev["params"].(map[string]any)
				if p["taskId"] == r.Task.TaskID && p["status"] == "completed" {
					require.Contains(t, p, "result")
					require.Contains(t, p["_meta"], "io.modelcontextprotocol/subscriptionId")
					return
				}
			}
		}
		t.Fatal("no completed notification")
	})

	t.Run("arguments are sealed at rest and kept out of logs", func(t *testing.T) {
		var sealed, bodies []byte
		require.NoError(t, s.pool.QueryRow(ctx, `SELECT args_sealed FROM pep.approval_tasks WHERE task_id = $1`, id).Scan(&sealed))
		require.NotContains(t, string(sealed), "acct-secret-991")
		require.NoError(t, s.pool.QueryRow(ctx, `SELECT body_sealed FROM pep.intents WHERE task_id = $1`, id).Scan(&bodies))
		require.Nil(t, bodies, "a bound intent keeps no submission body (sealed while it was open: pep.TestSettledIntentsDropTheirBody)")
		// A tool that fails on an allowed call: its error is the client's,
		// not the log's (a tool's message may quote its arguments).
		mark := s.mcp.mark()
		res, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "closed-secret-992", "amount": 10}, nil)
		require.NoError(t, err)
		require.True(t, res.IsError, "%s", res.Raw)
		// The log reaches the test through a pipe: wait for this call's
		// line, so that the checks below cover it and all before it.
		failed := s.mcp.waitLogAfter(mark, "tool failed", 30*time.Second)
		require.Equal(t, "wire_transfer", failed["tool"])
		logs := strings.Join(s.mcp.logLines(), "\n")
		require.NotContains(t, logs, "acct-secret-991")
		require.NotContains(t, logs, "closed-secret-992")
		require.NotContains(t, logs, s.alice)
		require.NotContains(t, logs, s.pepToken)
	})

	t.Run("ttlMs covers the retention after the end", func(t *testing.T) {
		require.NoError(t, alice.Cancel(ctx, id))
		var created, ended time.Time
		var ttl int64
		require.NoError(t, s.pool.QueryRow(ctx, `SELECT created_at, terminal_at, ttl_ms FROM pep.tasks WHERE id = $1`, id).Scan(&created, &ended, &ttl))
		require.False(t, created.Add(time.Duration(ttl)*time.Millisecond).Before(ended.Add(24*time.Hour)))
	})
}

func requireRPC(t *testing.T, err error, code int, msg string) {
	t.Helper()
	var re *tasks.RPCError
	require.ErrorAs(t, err, &re)
	require.Equal(t, code, re.Code, re.Message)
	require.Contains(t, re.Message, msg)
}

// TestLimits: a caller with too many pending approvals gets a non-requestable
// denial, not another request.
func TestLimits(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{})
	ctx := context.Background()
	alice := s.client(s.alice)
	for i := range 20 {
		r, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-many", "amount": 26000 + i}, nil)
		require.NoError(t, err)
		require.Equal(t, "task", r.ResultType)
	}
	res, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-many", "amount": 99999}, nil)
	require.NoError(t, err)
	require.True(t, res.IsError)
	require.Contains(t, string(res.Raw), "already waiting for a decision", "the pending bound, not the submission rate (the SEP-2848 suite's limits scenario shows both)")
	require.Contains(t, string(res.Raw), `"remediation":"unavailable"`)
	require.Len(t, s.pendingRequests(), 20)
	// Another caller is unaffected.
	r, err := s.client(s.mallory).CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-many", "amount": 99999}, nil)
	require.NoError(t, err)
	require.Equal(t, "task", r.ResultType)
}
