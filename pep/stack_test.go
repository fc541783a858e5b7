package pep_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/agentauth"
	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/internal/ratelimit"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
	up "github.com/omcp/arap/upstream"
	"github.com/omcp/arap/webhook"
)

// stack is the real gate and MCP server in front of a real backend (dev seed
// policy), on loopback, with nothing tracking tasks in the background: the
// test advances them itself (Gate.Advance is what the tracking job and a
// callback run), so every step happens when the test says.
type stack struct {
	env    *backendtest.Env
	db     *pgxpool.Pool // the front-end's database
	gate   *pep.Gate
	url    string // MCP endpoint
	server string // the front-end's base URL
	secret string // the callback endpoint's webhook secret
	alice  *tasks.Client
	// offset moves the front-end's clock (not the backend's).
	offset atomic.Int64
	// frozen, when set, is the front-end's clock, standing still (offset
	// is then ignored): for a check at an exact instant.
	frozen atomic.Pointer[time.Time]
	// hook, when set, sees every request the gate sends the backend before
	// it is sent (with its body); it may block it.
	hook atomic.Pointer[func(*http.Request, []byte)]
	// down, when set, fails every request to the backend as an unreachable
	// backend would (after the hook).
	down atomic.Bool
}

type pepOptions struct {
	policy      []byte // the backend's policy; the dev seed policy when nil
	maxWindow   time.Duration
	execTimeout time.Duration
	// run, when set, wraps wire_transfer's Run.
	run func(next func(context.Context, pep.Invocation) (pep.Output, error)) func(context.Context, pep.Invocation) (pep.Output, error)
	// sources offer tools beside the demo tools.
	sources []pep.ToolSource
	// upstreams pass their resources, prompts and completions through.
	upstreams *up.Registry
	// log, when set, gets the gate's and the server's logs.
	log *slog.Logger
	// listenStreams bounds each caller's listen streams (default 10).
	listenStreams int
	// private, when set, is the one database of the backend and the
	// front-end (a cluster the test may stop).
	private *dbtest.Private
	// privateBackend, when set, is the backend's database alone.
	privateBackend *dbtest.Private
	// privateCounters, when set, holds the front-end's rate counters alone.
	privateCounters *dbtest.Private
	// tracer, when set, sees every statement of the gate's own pool.
	tracer pgx.QueryTracer
	// approvalTools offers approval as ordinary tools (interim.go).
	approvalTools bool
	// agents admits OAuth access tokens (package agentauth).
	agents *agentauth.Verifier
	// wrap, when set, wraps the front-end's HTTP handler (to watch its
	// answers as they are written).
	wrap func(http.Handler) http.Handler
}

const aliceToken = "alice-token-0123"

func newPEP(t *testing.T, o pepOptions) *stack {
	t.Helper()
	var p *stack
	if o.private != nil {
		db, err := pgxpool.New(context.Background(), o.private.URL)
		require.NoError(t, err)
		t.Cleanup(db.Close)
		p = &stack{env: backendtest.Start(t, backendtest.Options{Policy: o.policy, DatabaseURL: o.private.URL}), db: db, secret: webhook.NewSecret()}
	} else {
		bo := backendtest.Options{Policy: o.policy}
		if o.privateBackend != nil {
			bo.DatabaseURL = o.privateBackend.URL
		}
		p = &stack{env: backendtest.Start(t, bo), db: dbtest.New(t), secret: webhook.NewSecret()}
	}
	if o.tracer != nil {
		p.db = tracedPool(t, p.db, o.tracer.(*roundTrips))
	}
	tools := pep.DemoTools()
	for i := range tools {
		if tools[i].Name == "wire_transfer" && o.run != nil {
			tools[i].Run = o.run(tools[i].Run)
		}
	}
	var err error
	p.gate, err = pep.NewGate(pep.Config{DB: p.db, MasterKey: make([]byte, 32), Tools: tools, Sources: o.sources,
		Backend:   &arapclient.Client{BaseURL: p.env.URL, Token: dev.PEPToken, HTTP: &http.Client{Transport: hooked{p}, Timeout: time.Minute}},
		MaxWindow: o.maxWindow, ExecTimeout: o.execTimeout, Log: o.log, ApprovalTools: o.approvalTools,
		Now: func() time.Time {
			if f := p.frozen.Load(); f != nil {
				return *f
			}
			return time.Now().Add(time.Duration(p.offset.Load()))
		}})
	require.NoError(t, err)
	t.Cleanup(p.gate.Stop) // before the pool closes: cleanups run last first
	require.NoError(t, p.gate.Callers().Create(context.Background(), "alice-agent", aliceToken, pep.Principal{SubjectType: "user", SubjectID: "alice", ActorID: "agent:demo"}))
	notifier := tasks.NewNotifier(p.db, tasks.ListenConfig{MaxStreams: o.listenStreams})
	require.NoError(t, notifier.Start(context.Background()))
	t.Cleanup(notifier.Stop)
	var counters *ratelimit.Counters
	if o.privateCounters != nil {
		cdb, err := pgxpool.New(context.Background(), o.privateCounters.URL)
		require.NoError(t, err)
		t.Cleanup(cdb.Close)
		counters = ratelimit.NewCounters(cdb, pep.RateCounters)
	}
	srv, err := pep.NewServer(p.gate, pep.ServerOptions{Name: "test", Version: "0", RequestsPerMinute: 100000, WebhookSecrets: []string{p.secret}, Upstreams: o.upstreams, Notifier: notifier, Log: o.log, Counters: counters, Agents: o.agents})
	require.NoError(t, err)
	var handler http.Handler = srv
	if o.wrap != nil {
		handler = o.wrap(srv)
	}
	h := httptest.NewServer(handler)
	t.Cleanup(h.Close)
	p.server, p.url = h.URL, h.URL+pep.PathMCP
	p.alice = &tasks.Client{URL: p.url, Token: aliceToken}
	return p
}

// hooked sends the gate's backend requests through stack.hook first.
type hooked struct{ p *stack }

func (h hooked) RoundTrip(r *http.Request) (*http.Response, error) {
	if f := h.p.hook.Load(); f != nil {
		var body []byte
		if r.Body != nil {
			body, _ = io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		(*f)(r, body)
	}
	if h.p.down.Load() {
		return nil, errors.New("test: the backend is unreachable")
	}
	return http.DefaultTransport.RoundTrip(r)
}

// onBackend sets the hook (nil removes it).
func (p *stack) onBackend(f func(*http.Request, []byte)) {
	if f == nil {
		p.hook.Store(nil)
		return
	}
	p.hook.Store(&f)
}

// reevaluation reports whether a backend request is a re-evaluation with an
// approval.
func reevaluation(r *http.Request, body []byte) bool {
	return r.URL.Path == authzen.PathEvaluation && bytes.Contains(body, []byte(`"approval"`))
}

// transfer calls wire_transfer (requestable over 25000) as alice and returns
// the task id.
func (p *stack) transfer(t *testing.T, amount int) string {
	t.Helper()
	r, err := p.alice.CallTool(context.Background(), "wire_transfer", map[string]any{"to": "acct-" + strconv.Itoa(amount), "amount": amount}, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeTask, r.ResultType, "%s", r.Raw)
	return r.Task.TaskID
}

// request is the backend request a task waits on now.
func (p *stack) request(t *testing.T, taskID string) string {
	t.Helper()
	var id string
	require.NoError(t, p.db.QueryRow(context.Background(), `SELECT backend_id FROM pep.approval_tasks WHERE task_id = $1`, taskID).Scan(&id))
	return id
}

// backendAPI sends one request to the backend with token.
func (p *stack) backendAPI(t *testing.T, token, method, path string, body any) (int, map[string]any) {
	t.Helper()
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequest(method, p.env.URL+path, bytes.NewReader(raw))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// approve approves backend request id as the dev ITSM system, until the
// time given (zero: the policy's default).
func (p *stack) approve(t *testing.T, id string, until time.Time) {
	t.Helper()
	body := map[string]any{"decision": "approve", "reason": "test"}
	if !until.IsZero() {
		body["approved_until"] = until.UTC().Format(time.RFC3339)
	}
	code, out := p.backendAPI(t, dev.ITSMToken, "POST", "/v1/requests/"+id+"/decisions", body)
	require.Equal(t, 200, code, "%v", out)
}

// approval reads backend request id's status as the PEP and returns its
// approval.
func (p *stack) approval(t *testing.T, id string) *authzen.Approval {
	t.Helper()
	c := &arapclient.Client{BaseURL: p.env.URL, Token: dev.PEPToken}
	tr, _, err := c.Status(context.Background(), p.env.URL+authzen.PathRequests+"/"+id)
	require.NoError(t, err)
	require.Equal(t, authzen.StatusApproved, tr.Task.Status)
	require.NotNil(t, tr.Result)
	require.NotNil(t, tr.Result.Approval)
	return tr.Result.Approval
}

// advance runs Advance once, as the look sweep or a callback would.
func (p *stack) advance(t *testing.T, taskID string) {
	t.Helper()
	_, err := p.gate.Advance(context.Background(), taskID)
	require.NoError(t, err)
}

// get reads the task over MCP (tasks/get), as its caller.
func (p *stack) get(t *testing.T, taskID string) *tasks.Detailed {
	t.Helper()
	d, _, err := p.alice.Get(context.Background(), taskID)
	require.NoError(t, err)
	return d
}

// disposition is a completed task's SEP-2848 disposition.
func disposition(t *testing.T, d *tasks.Detailed) string {
	t.Helper()
	require.Equal(t, tasks.Completed, d.Status, "%s", d.StatusMessage)
	var r struct {
		Meta map[string]any `json:"_meta"`
	}
	require.NoError(t, json.Unmarshal(d.Result, &r))
	s, _ := r.Meta[pep.MetaDisposition].(string)
	return s
}

// ledger counts the task's executions.
func (p *stack) ledger(t *testing.T, taskID string) int {
	t.Helper()
	var n int
	require.NoError(t, p.db.QueryRow(context.Background(), `SELECT count(*) FROM pep.ledger WHERE task_id = $1`, taskID).Scan(&n))
	return n
}

// trail is the kinds of the task's audit events, in order.
func (p *stack) trail(t *testing.T, taskID string) []string {
	t.Helper()
	recs, err := pep.AuditChain(context.Background(), p.db, taskID)
	require.NoError(t, err)
	kinds := []string{}
	for _, r := range recs {
		kinds = append(kinds, r.Kind)
	}
	return kinds
}

// requireIntact verifies the whole audit trail.
func (p *stack) requireIntact(t *testing.T) pep.AuditReport {
	t.Helper()
	rep, err := pep.VerifyAudit(context.Background(), p.db)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", rep.Breaks)
	return rep
}

// callback sends a signed callback about backend request id for taskID to
// the front-end's callback endpoint, as the backend would, and returns the
// status code.
func (p *stack) callback(t *testing.T, taskID, id, status string) int {
	t.Helper()
	key, err := webhook.ParseSecret(p.secret)
	require.NoError(t, err)
	body, err := json.Marshal(map[string]any{"state": taskID, "task": map[string]any{"id": id, "status": status}})
	require.NoError(t, err)
	msg := "msg_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	ts := time.Now().Unix()
	req, err := http.NewRequest(http.MethodPost, p.server+pep.PathCallback, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(webhook.HeaderID, msg)
	req.Header.Set(webhook.HeaderTimestamp, strconv.FormatInt(ts, 10))
	req.Header.Set(webhook.HeaderSignature, webhook.Sign(key, msg, ts, body))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}
