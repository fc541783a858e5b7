package pep_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/mcp/tasks"
)

// TestDatabaseDown: while PostgreSQL is stopped (fast, then as a crash),
// tasks/get and tools/call answer the retryable error (HTTP 503,
// Retry-After, JSON-RPC CodeUnavailable naming the wait) and nothing else;
// once it is back, the same task reads as before and a call answers a
// task again.
func TestDatabaseDown(t *testing.T) {
	db := dbtest.NewPrivate(t)
	p := newPEP(t, pepOptions{private: db})
	ctx := context.Background()
	id := p.transfer(t, 50000)
	before := p.get(t, id)
	backendID := p.request(t, id)
	// A go-sdk client session, connected while all is well.
	c := sdk.NewClient(&sdk.Implementation{Name: "client", Version: "1"}, nil)
	sess, err := c.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: p.url, HTTPClient: &http.Client{Transport: bearer(aliceToken)}}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sess.Close() })

	unavailable := func(err error) {
		t.Helper()
		var re *tasks.RPCError
		require.ErrorAs(t, err, &re)
		require.Equal(t, tasks.CodeUnavailable, re.Code, "%s", re.Message)
		require.Equal(t, "temporarily unavailable: the database is unavailable; retry after 2 s", re.Message)
		require.Equal(t, http.StatusServiceUnavailable, re.HTTPStatus)
		require.JSONEq(t, `{"retryAfterSeconds":2}`, string(re.Data))
	}
	count := func() (n int) {
		require.NoError(t, p.db.QueryRow(ctx, `SELECT count(*) FROM pep.tasks`).Scan(&n))
		return n
	}
	for i, immediate := range []bool{false, true} {
		tasksBefore := count()
		db.Stop(t, immediate)

		_, _, err := p.alice.Get(ctx, id)
		unavailable(err)
		_, err = p.alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-1", "amount": 50000}, nil)
		unavailable(err)
		// On the wire: Retry-After, and the request's id in the answer.
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 7, "method": tasks.MethodGet,
			"params": map[string]any{"taskId": id, "_meta": map[string]any{tasks.MetaProtocolVersion: tasks.ProtocolVersion}}})
		req, err := http.NewRequest("POST", p.url, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+aliceToken)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set(tasks.HeaderName, id)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		var answer struct {
			ID    json.RawMessage `json:"id"`
			Error tasks.RPCError  `json:"error"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&answer))
		resp.Body.Close()
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		require.Equal(t, "2", resp.Header.Get("Retry-After"))
		require.Equal(t, "7", string(answer.ID))
		require.Equal(t, tasks.CodeUnavailable, answer.Error.Code)
		// A callback is refused 503 (its webhook-id cannot be claimed);
		// the backend delivers it again later.
		require.Equal(t, http.StatusServiceUnavailable, p.callback(t, id, backendID, "approved"))
		// The go-sdk client reads a 503 as transient (it keeps the
		// session) and reports the status, not the body.
		_, err = sess.CallTool(ctx, &sdk.CallToolParams{Name: "wire_transfer", Arguments: map[string]any{"to": "acct-1", "amount": 50000}})
		require.ErrorContains(t, err, "Service Unavailable")

		db.Start(t)
		var after *tasks.Detailed
		require.Eventually(t, func() bool {
			after, _, err = p.alice.Get(ctx, id)
			return err == nil
		}, 30*time.Second, 50*time.Millisecond)
		require.Equal(t, before.Status, after.Status, "the outage changed nothing")
		require.Equal(t, tasksBefore, count(), "the refused calls left no task")
		_, err = sess.ListTools(ctx, nil)
		require.NoError(t, err, "the go-sdk session survived the outage")
		t.Logf("iteration %d: a new call after the restart", i)
		p.transfer(t, 60000)
	}
}

// TestBackendDatabaseDown: while only the backend's database is stopped,
// a call that needs the backend answers the retryable error naming the
// service that could not answer (the backend answered 503; the gate retried
// within its bounds): the authorization service once the PDP's attribute
// cache (a second) has aged, the approval service before that. The
// front-end's own tasks still read, and after the restart the call opens
// its task.
func TestBackendDatabaseDown(t *testing.T) {
	db := dbtest.NewPrivate(t)
	p := newPEP(t, pepOptions{privateBackend: db})
	ctx := context.Background()
	id := p.transfer(t, 50000)

	db.Stop(t, false)
	_, err := p.alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-2", "amount": 50000}, nil)
	var re *tasks.RPCError
	require.ErrorAs(t, err, &re)
	require.Equal(t, tasks.CodeUnavailable, re.Code, "%s", re.Message)
	require.Regexp(t, `^temporarily unavailable: the (approval|authorization) service is unavailable`, re.Message)
	require.Contains(t, re.Message, "retry after 2 s")
	require.Equal(t, http.StatusOK, re.HTTPStatus, "dispatched by the SDK")
	require.Equal(t, tasks.Working, p.get(t, id).Status)

	db.Start(t)
	require.Eventually(t, func() bool {
		r, err := p.alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-2", "amount": 50000}, nil)
		return err == nil && r.ResultType == tasks.ResultTypeTask
	}, 30*time.Second, 50*time.Millisecond)
}

// TestRateLimitDatabaseDown: when the rate limit cannot be counted because
// its database is unavailable (the callers' is up), the request is refused
// as retryable (503, Retry-After, CodeUnavailable), not as an internal
// error; once it is back, calls are counted and served again.
func TestRateLimitDatabaseDown(t *testing.T) {
	db := dbtest.NewPrivate(t)
	p := newPEP(t, pepOptions{privateCounters: db})
	ctx := context.Background()
	id := p.transfer(t, 50000)

	db.Stop(t, false)
	// The limiter counts in batches of 1% of the limit (here 100): the
	// requests left in its batch pass; the next one must count.
	var err error
	for range 200 {
		if _, _, err = p.alice.Get(ctx, id); err != nil {
			break
		}
	}
	var re *tasks.RPCError
	require.ErrorAs(t, err, &re)
	require.Equal(t, tasks.CodeUnavailable, re.Code, "%s", re.Message)
	require.Equal(t, http.StatusServiceUnavailable, re.HTTPStatus)

	db.Start(t)
	require.Eventually(t, func() bool {
		_, _, err := p.alice.Get(ctx, id)
		return err == nil
	}, 30*time.Second, 50*time.Millisecond)
}

// TestInternalErrorSaysNothingOfItsCause: an error the front-end has no
// answer for (here its table is gone, as a state lost by an asynchronous
// failover leaves no row where one must be) is answered -32603 "internal
// error", not code 0 with the driver's text naming the table; the cause is
// in the log (written before the answer), nothing is left behind, and once
// the table is back the same call opens its task.
func TestInternalErrorSaysNothingOfItsCause(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var buf bytes.Buffer
	p := newPEP(t, pepOptions{log: slog.New(slog.NewJSONHandler(lockedWriter{&mu, &buf}, nil))})
	ctx := context.Background()
	_, err := p.db.Exec(ctx, `ALTER TABLE pep.approval_tasks RENAME TO approval_tasks_gone`)
	require.NoError(t, err)
	_, err = p.alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-1", "amount": 50000}, nil)
	var re *tasks.RPCError
	require.ErrorAs(t, err, &re)
	require.Equal(t, tasks.CodeInternalError, re.Code, "%s", re.Message)
	require.Equal(t, "internal error", re.Message)
	mu.Lock()
	logged := buf.String()
	mu.Unlock()
	require.Regexp(t, `"level":"ERROR","msg":"tools/call","error":"[^\n]*approval_tasks`, logged, "the cause is logged for the operator")
	var n int
	require.NoError(t, p.db.QueryRow(ctx, `SELECT count(*) FROM pep.tasks`).Scan(&n))
	require.Zero(t, n, "the failed call left a task")
	_, err = p.db.Exec(ctx, `ALTER TABLE pep.approval_tasks_gone RENAME TO approval_tasks`)
	require.NoError(t, err)
	p.transfer(t, 50000)
}
