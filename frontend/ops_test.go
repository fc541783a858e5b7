package frontend_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/frontend"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
)

// opsStack is a started front-end in front of a real backend (dev seed
// policy), with its log captured as the JSON lines it writes.
type opsStack struct {
	env       *backendtest.Env
	f         *frontend.Frontend
	log       *lockedBuffer
	upstreams atomic.Pointer[map[string]error] // what UpstreamsReady answers
}

func newOpsStack(t *testing.T) *opsStack { return newOpsStackOn(t, nil) }

// newOpsStackOn is newOpsStack with the backend and the front-end on one
// database of the test's own (as arapd dev runs them), when db is set.
func newOpsStackOn(t *testing.T, db *dbtest.Private) *opsStack { return newOpsStackWith(t, db, nil) }

// newOpsStackWith is newOpsStackOn with the front-end's configuration
// changed by edit.
func newOpsStackWith(t *testing.T, db *dbtest.Private, edit func(*frontend.Config)) *opsStack {
	t.Helper()
	ctx := context.Background()
	backendDB, frontDB := "", ""
	if db != nil {
		backendDB, frontDB = db.URL, db.URL
	} else {
		frontDB = dbtest.URL(t)
	}
	s := &opsStack{env: backendtest.Start(t, backendtest.Options{DatabaseURL: backendDB}), log: &lockedBuffer{}}
	s.upstreams.Store(&map[string]error{"crm": nil})
	cfg := frontend.Config{Addr: "127.0.0.1:0", DatabaseURL: frontDB, MasterKey: make([]byte, 32), Tools: pep.DemoTools(),
		BackendURL: s.env.URL, BackendToken: dev.PEPToken,
		UpstreamsReady: func(context.Context) map[string]error { return *s.upstreams.Load() },
		Log:            slog.New(slog.NewJSONHandler(s.log, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	if edit != nil {
		edit(&cfg)
	}
	f, err := frontend.New(ctx, cfg)
	require.NoError(t, err)
	s.f = f
	require.NoError(t, f.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = f.Stop(ctx)
	})
	return s
}

// caller registers an MCP caller for alice with a fresh token.
func (s *opsStack) caller(t *testing.T, name string) *tasks.Client {
	t.Helper()
	token := "tok-" + rand.Text()
	require.NoError(t, s.f.Gate().Callers().Create(context.Background(), name, token,
		pep.Principal{SubjectType: "user", SubjectID: "alice", ActorID: "agent:demo"}))
	return &tasks.Client{URL: s.f.URL() + pep.PathMCP, Token: token}
}

func (s *opsStack) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(s.f.URL() + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// readyz returns /readyz's status and the components it names failing.
func (s *opsStack) readyz(t *testing.T) (int, []string) {
	t.Helper()
	code, body := s.get(t, pep.PathReady)
	var out struct {
		Status  string   `json:"status"`
		Failing []string `json:"failing"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &out), body)
	if code == http.StatusOK {
		require.Equal(t, "ready", out.Status)
	} else {
		require.Equal(t, "unavailable", out.Status)
	}
	return code, out.Failing
}

// TestReadyz: ready when the process, its database, the backend and every
// upstream answer; otherwise 503 naming exactly what does not, and never
// its error (which may hold addresses or credentials).
func TestReadyz(t *testing.T) {
	s := newOpsStack(t)
	code, failing := s.readyz(t)
	require.Equal(t, http.StatusOK, code)
	require.Empty(t, failing)

	// An upstream down: named, its error (with a credential) only logged.
	s.upstreams.Store(&map[string]error{"crm": nil, "files": errors.New("dial http://user:hunter2-upstream@10.0.0.9/mcp: refused")})
	code, failing = s.readyz(t)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, []string{"upstream:files"}, failing)
	_, body := s.get(t, pep.PathReady)
	require.NotContains(t, body, "hunter2")
	require.NotContains(t, body, "http")
	s.upstreams.Store(&map[string]error{"crm": nil})
	code, _ = s.readyz(t)
	require.Equal(t, http.StatusOK, code)

	// The backend stopped: named, and its URL is not in the body.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, s.env.Backend.Stop(ctx))
	code, failing = s.readyz(t)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, []string{"backend"}, failing)
	_, body = s.get(t, pep.PathReady)
	require.NotContains(t, body, strings.TrimPrefix(s.env.URL, "http://"))
	require.Equal(t, http.StatusOK, func() int { c, _ := s.get(t, pep.PathHealth); return c }(), "/healthz is liveness only")
}

// TestReadyzDatabase: with the database gone (its pool closed) /readyz
// names it.
func TestReadyzDatabase(t *testing.T) {
	s := newOpsStack(t)
	code, _ := s.readyz(t)
	require.Equal(t, http.StatusOK, code)
	s.f.Pool().Close()
	code, failing := s.readyz(t)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, []string{"database"}, failing)
}

// approveAndRun approves the backend request task waits on (as the dev
// ITSM resolver) and advances the task, which runs the tool.
func (s *opsStack) approveAndRun(t *testing.T, taskID string) {
	t.Helper()
	ctx := context.Background()
	var id string
	require.NoError(t, s.f.Pool().QueryRow(ctx, `SELECT backend_id FROM pep.approval_tasks WHERE task_id = $1`, taskID).Scan(&id))
	body := strings.NewReader(`{"decision": "approve", "reason": "test"}`)
	req, err := http.NewRequest(http.MethodPost, s.env.URL+"/v1/requests/"+id+"/decisions", body)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+dev.ITSMToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	_, err = s.f.Gate().Advance(ctx, taskID)
	require.NoError(t, err)
}

// metric returns the value of the sample with exactly this name and
// labels (as the text format writes them, sorted), and whether it is there.
func metric(body, sample string) (string, bool) {
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), sample+" "); ok {
			return v, true
		}
	}
	return "", false
}

// TestMetrics: every outcome the demo tools can produce is counted by tool
// and outcome, task endings by outcome, tasks by status (counted at
// scrape), upstream requests through the hook; /metrics answers GET only.
func TestMetrics(t *testing.T) {
	s := newOpsStack(t)
	ctx := context.Background()
	alice := s.caller(t, "alice-agent")
	plain := &tasks.Client{URL: alice.URL, Token: alice.Token, NoTasks: true}

	r, err := alice.CallTool(ctx, "get_balance", map[string]any{}, nil)
	require.NoError(t, err)
	require.False(t, r.IsError, "%s", r.Raw)
	r, err = alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-1", "amount": 50000}, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeTask, r.ResultType, "%s", r.Raw)
	taskID := r.Task.TaskID
	r, err = alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-2", "amount": 60000}, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeTask, r.ResultType, "%s", r.Raw)
	s.approveAndRun(t, r.Task.TaskID)
	done, _, err := alice.Get(ctx, r.Task.TaskID)
	require.NoError(t, err)
	require.Equal(t, tasks.Completed, done.Status)
	_, err = plain.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-3", "amount": 50000}, nil)
	require.NoError(t, err)
	_, err = alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-4", "amount": 2000000}, nil)
	require.NoError(t, err)
	r, err = alice.CallTool(ctx, "read_customer_record", map[string]any{"customer_id": "c-1"}, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeInputRequired, r.ResultType, "%s", r.Raw)
	_, err = alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-5"}, nil)
	var rpcErr *tasks.RPCError
	require.ErrorAs(t, err, &rpcErr)
	require.NoError(t, alice.Cancel(ctx, taskID))

	code, _ := s.get(t, pep.PathHealth)
	require.Equal(t, http.StatusOK, code)
	m := s.f.Gate().Metrics()
	m.ObserveUpstream("crm", 20*time.Millisecond, nil)
	m.ObserveUpstream("crm", 2*time.Second, context.DeadlineExceeded)
	m.ObserveUpstream("crm", time.Millisecond, &jsonrpc.Error{Code: -32602, Message: "bad"})

	want := map[string]string{
		`arap_pep_calls_total{outcome="allowed-executed",tool="get_balance"}`:        "1",
		`arap_pep_calls_total{outcome="task-created",tool="wire_transfer"}`:          "2",
		`arap_pep_calls_total{outcome="degraded",tool="wire_transfer"}`:              "1",
		`arap_pep_calls_total{outcome="denied-not-executed",tool="wire_transfer"}`:   "1",
		`arap_pep_calls_total{outcome="input-required",tool="read_customer_record"}`: "1",
		`arap_pep_calls_total{outcome="invalid",tool="wire_transfer"}`:               "1",
		`arap_pep_tasks_ended_total{outcome="cancelled"}`:                            "1",
		`arap_pep_tasks_ended_total{outcome="approved-executed"}`:                    "1",
		`arap_pep_tasks{status="working"}`:                                           "0",
		`arap_pep_tasks{status="cancelled"}`:                                         "1",
		`arap_pep_tasks{status="completed"}`:                                         "1",
		`arap_pep_upstream_request_duration_seconds_count{upstream="crm"}`:           "3",
		`arap_pep_upstream_errors_total{kind="timeout",upstream="crm"}`:              "1",
		`arap_pep_upstream_errors_total{kind="rpc",upstream="crm"}`:                  "1",
		// Counted as each response ends, after the client may have read it;
		// 8 and the tools/list each client sends before its first call.
		`arap_pep_http_requests_total{code="200",method="POST",route="/mcp"}`:    "10",
		`arap_pep_http_requests_total{code="400",method="POST",route="/mcp"}`:    "1", // -32602 is a 400
		`arap_pep_http_requests_total{code="200",method="GET",route="/healthz"}`: "1",
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		code, body := s.get(t, pep.PathMetrics)
		require.Equal(c, http.StatusOK, code)
		for sample, v := range want {
			got, ok := metric(body, sample)
			assert.True(c, ok, "%s missing", sample)
			assert.Equal(c, v, got, sample)
		}
	}, 10*time.Second, 20*time.Millisecond)

	_, body := s.get(t, pep.PathMetrics)
	require.Regexp(t, `(?m)^arap_build_info\{goversion="go[^"]+",revision="[^"]+",version="[^"]+"\} 1$`, body)

	req, _ := http.NewRequest(http.MethodPost, s.f.URL()+pep.PathMetrics, nil)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
}

// TestAccessLog: one line per request, with the route, status, caller
// name, JSON-RPC method, tool and outcome, and none of the bearer token,
// the tool's arguments or the query string.
func TestAccessLog(t *testing.T) {
	s := newOpsStack(t)
	ctx := context.Background()
	alice := s.caller(t, "alice-logged")
	secretArg := "acct-" + rand.Text()
	secretQuery := "q-" + rand.Text()
	alice.URL += "?key=" + secretQuery
	r, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": secretArg, "amount": 50000}, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeTask, r.ResultType, "%s", r.Raw)

	var line map[string]any
	require.Eventually(t, func() bool {
		for _, l := range s.log.lines() {
			var rec map[string]any
			if json.Unmarshal([]byte(l), &rec) == nil && rec["msg"] == "http request" && rec["rpc_method"] == "tools/call" {
				line = rec
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond, "the access line is written once the response is")
	require.Equal(t, "POST", line["method"])
	require.Equal(t, pep.PathMCP, line["route"])
	require.EqualValues(t, http.StatusOK, line["status"])
	require.Equal(t, "alice-logged", line["caller"])
	require.Equal(t, "wire_transfer", line["tool"])
	require.Equal(t, pep.OutcomeTaskCreated, line["outcome"])
	require.NotEmpty(t, line["request_id"])
	// Everything the process will log about this call is in once it has
	// stopped (its tracking job included).
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, s.f.Stop(stopCtx))
	all := s.log.String()
	require.NotContains(t, all, secretArg, "tool arguments are never logged")
	require.NotContains(t, all, alice.Token, "tokens are never logged")
	require.NotContains(t, all, secretQuery, "query strings are never logged")
}

// TestAccessLogClientAddress: the access line's remote is the peer, and
// X-Forwarded-For names the client only when the peer is a configured
// trusted proxy (--trusted-proxies), as in the backend.
func TestAccessLogClientAddress(t *testing.T) {
	remote := func(s *opsStack, xff string) string {
		req, _ := http.NewRequest(http.MethodGet, s.f.URL()+pep.PathHealth, nil)
		req.Header.Set("X-Forwarded-For", xff)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		var got string
		require.Eventually(t, func() bool {
			for _, l := range s.log.lines() {
				var rec map[string]any
				if json.Unmarshal([]byte(l), &rec) == nil && rec["msg"] == "http request" && rec["route"] == pep.PathHealth {
					got, _ = rec["remote"].(string)
					return true
				}
			}
			return false
		}, 10*time.Second, 10*time.Millisecond)
		return got
	}
	require.Equal(t, "127.0.0.1", remote(newOpsStack(t), "198.51.100.9"), "an untrusted peer's header is ignored")
	trusting := newOpsStackWith(t, nil, func(c *frontend.Config) {
		c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	})
	require.Equal(t, "198.51.100.9", remote(trusting, "198.51.100.9, 127.0.0.1"), "a trusted proxy's header names the client")
}

// lockedBuffer is an io.Writer safe for concurrent log writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *lockedBuffer) lines() []string { return strings.Split(strings.TrimSpace(b.String()), "\n") }
