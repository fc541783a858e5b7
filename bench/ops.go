package bench

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
)

// Client is the load generator's HTTP client: keep-alive, enough idle
// connections for every worker.
var Client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
	MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, IdleConnTimeout: time.Minute,
}}

func nonce() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// send makes one HTTP request (a JSON body when body is not nil) and
// returns the status and the response body.
func send(ctx context.Context, method, url, token string, body []byte, header ...string) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := Client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

func post(ctx context.Context, url, token string, body []byte, header ...string) (int, []byte, error) {
	return send(ctx, http.MethodPost, url, token, body, header...)
}

func get(ctx context.Context, url, token string) (int, []byte, error) {
	return send(ctx, http.MethodGet, url, token, nil)
}

// evaluation is the AuthZEN request the PEP makes for a wire_transfer of
// amount: over 25,000 the dev policy answers with a requestable denial and
// a signed binding_token, up to it with an allow (after the same rules'
// conditions).
func evaluation(to string, amount int) map[string]any {
	return map[string]any{
		"subject":  map[string]any{"type": "user", "id": "alice", "properties": map[string]any{"act": map[string]any{"sub": "agent:demo"}}},
		"action":   map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": "wire_transfer", "properties": map[string]any{"arguments": map[string]any{"to": to, "amount": amount}}},
	}
}

var (
	evaluationBody, _ = json.Marshal(evaluation("acct-991", 50000)) // requestable
	allowedBody, _    = json.Marshal(evaluation("acct-991", 100))
)

// Evaluate is POST /access/v1/evaluation answered with an allow (allow
// true) or a requestable denial, which alone carries a binding_token and
// so an ES256 signature.
func (s *System) Evaluate(allow bool) Op {
	url := s.BackendURL + "/access/v1/evaluation"
	body, want := evaluationBody, []byte(`"binding_token"`)
	if allow {
		body, want = allowedBody, []byte(`"decision":true`)
	}
	return func(ctx context.Context, _ int) (time.Duration, error) {
		code, out, err := post(ctx, url, s.PEPToken, body)
		if err != nil {
			return 0, err
		}
		if code != http.StatusOK || !bytes.Contains(out, want) {
			return 0, fmt.Errorf("evaluate (allow %v): HTTP %d %.200s", allow, code, out)
		}
		return 0, nil
	}
}

// submitted collects the status endpoints of requests made by Submit.
type submitted struct {
	mu   sync.Mutex
	urls []string
}

// submission evaluates a fresh call and returns the submission body for
// its denial.
func (s *System) submission(ctx context.Context) ([]byte, error) {
	call := evaluation("acct-"+nonce(), 50000)
	b, _ := json.Marshal(call)
	code, body, err := post(ctx, s.BackendURL+"/access/v1/evaluation", s.PEPToken, b)
	if err != nil {
		return nil, err
	}
	var d struct {
		Context struct {
			EvaluationID  string `json:"evaluation_id"`
			AccessRequest struct {
				ExpiresAt    string `json:"expires_at"`
				BindingToken string `json:"binding_token"`
			} `json:"access_request"`
		} `json:"context"`
	}
	if code != http.StatusOK || json.Unmarshal(body, &d) != nil || d.Context.AccessRequest.BindingToken == "" {
		return nil, fmt.Errorf("submit: evaluation HTTP %d %.200s", code, body)
	}
	call["denial"] = map[string]any{"expires_at": d.Context.AccessRequest.ExpiresAt, "binding_token": d.Context.AccessRequest.BindingToken,
		"evaluation_id": d.Context.EvaluationID}
	return json.Marshal(call)
}

// Submissions makes n submission bodies ahead of a measurement (each needs
// its own denial: a binding_token is good for one request), so that submit
// measures the Access Request Service alone.
func (s *System) Submissions(ctx context.Context, n, concurrency int) (chan []byte, error) {
	out := make(chan []byte, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	per := (n + concurrency - 1) / concurrency
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range per {
				b, err := s.submission(ctx)
				if err != nil {
					mu.Lock()
					first = cmp.Or(first, err)
					mu.Unlock()
					return
				}
				select {
				case out <- b:
				default:
					return
				}
			}
		}()
	}
	wg.Wait()
	return out, first
}

// Submit submits a denial under a fresh Idempotency-Key. Bodies come from
// ready (made beforehand); when it runs dry, one is made on the spot, not
// timed.
func (s *System) Submit(ready chan []byte, into *submitted) Op {
	subURL := s.BackendURL + "/access/v1/requests"
	return func(ctx context.Context, _ int) (time.Duration, error) {
		var b []byte
		select {
		case b = <-ready:
		default:
			var err error
			if b, err = s.submission(ctx); err != nil {
				return 0, err
			}
		}
		t0 := time.Now()
		code, body, err := post(ctx, subURL, s.PEPToken, b, "Idempotency-Key", nonce())
		took := time.Since(t0)
		if err != nil {
			return 0, err
		}
		var r struct {
			Task struct {
				StatusEndpoint string `json:"status_endpoint"`
			} `json:"task"`
		}
		if code != http.StatusAccepted || json.Unmarshal(body, &r) != nil || r.Task.StatusEndpoint == "" {
			return 0, fmt.Errorf("submit: HTTP %d %.200s", code, body)
		}
		if into != nil {
			into.mu.Lock()
			into.urls = append(into.urls, r.Task.StatusEndpoint)
			into.mu.Unlock()
		}
		return took, nil
	}
}

// Status reads random status endpoints of the given requests.
func (s *System) Status(urls []string) Op {
	return func(ctx context.Context, _ int) (time.Duration, error) {
		n, _ := rand.Int(rand.Reader, big.NewInt(int64(len(urls))))
		code, body, err := get(ctx, urls[n.Int64()], s.PEPToken)
		if err != nil {
			return 0, err
		}
		if code != http.StatusOK {
			return 0, fmt.Errorf("status: HTTP %d %.200s", code, body)
		}
		return 0, nil
	}
}

// Fill adds n ended requests to arap.requests, copies of an existing one,
// so status reads run against a table of realistic size.
func (s *System) Fill(ctx context.Context, n int) error {
	const cols = `client_id, status, status_reason, rule, subject, resource, action, context, requested_access, client_info, denial,
		evaluation_id, binding_hash, binding_context_members, display, expires_at, created_at, updated_at, terminal_at, result`
	for done := 0; done < n; {
		k := min(100_000, n-done)
		_, err := s.DB.Exec(ctx, `INSERT INTO arap.requests (id, `+cols+`)
			SELECT 'arq_fill_' || $1::int + g, t.client_id, 'denied', 'fill', t.rule, t.subject, t.resource, t.action, t.context, t.requested_access,
				t.client_info, t.denial, t.evaluation_id, t.binding_hash, t.binding_context_members, t.display, t.expires_at, t.created_at, now(), now(), t.result
			FROM generate_series(1, $2::int) g, (SELECT * FROM arap.requests WHERE id NOT LIKE 'arq_fill_%' LIMIT 1) t`, done, k)
		if err != nil {
			return fmt.Errorf("bench: fill requests: %w", err)
		}
		done += k
	}
	_, err := s.DB.Exec(ctx, `ANALYZE arap.requests`)
	return err
}

// mcpClient is the MCP client the e2e tests use, as token: one per token,
// kept, as a real agent keeps its client, so the tools/list it sends
// before its first call is not counted in every operation.
func (s *System) mcpClient(token string) *tasks.Client {
	if c, ok := s.clients.Load(token); ok {
		return c.(*tasks.Client)
	}
	c, _ := s.clients.LoadOrStore(token, &tasks.Client{URL: s.MCPURL, Token: token, HTTP: Client})
	return c.(*tasks.Client)
}

// ListTools has every caller's client list the tools, as an agent does once
// before its first call (tasks.Client.CallTool), concurrency at a time, so
// that no measured call carries a tools/list: with 2,000 callers a run of
// the gate made a first call for most of them.
func (s *System) ListTools(ctx context.Context, concurrency int) error {
	concurrency = max(concurrency, 1)
	next := make(chan string)
	errs := make(chan error, concurrency)
	for range concurrency {
		go func() {
			var first error
			for token := range next {
				if _, _, err := s.mcpClient(token).ListTools(ctx); err != nil && first == nil {
					first = err
				}
			}
			errs <- first
		}()
	}
	for _, token := range s.Callers {
		next <- token
	}
	close(next)
	var err error
	for range concurrency {
		err = cmp.Or(err, <-errs)
	}
	if err != nil {
		return fmt.Errorf("bench: tools/list: %w", err)
	}
	return nil
}

// Gate is an MCP tools/call that gets a requestable denial and answers
// with a CreateTaskResult: the whole PEP path (evaluate, intent, submit,
// bind, task). Calls rotate over the callers, whose live tasks are bounded.
func (s *System) Gate(next *atomic.Int64) Op {
	return func(ctx context.Context, _ int) (time.Duration, error) {
		token := s.Callers[int(next.Add(1))%len(s.Callers)]
		_, err := s.task(ctx, token)
		return 0, err
	}
}

func (s *System) task(ctx context.Context, token string) (string, error) {
	r, err := s.mcpClient(token).CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-" + nonce(), "amount": 50000}, nil)
	if err != nil {
		return "", err
	}
	if r.ResultType != tasks.ResultTypeTask || r.Task.TaskID == "" {
		return "", fmt.Errorf("gate: not a task: %.200s", r.Raw)
	}
	return r.Task.TaskID, nil
}

// Upstream is one call of the upstream's simplest tool, directly on the
// upstream (via false) or through arapd mcp (via true), which asks the PDP
// (allowed), forwards it and relays the result: their difference is what
// the gateway adds to an allowed call.
func (s *System) Upstream(via bool, next *atomic.Int64) Op {
	return func(ctx context.Context, _ int) (time.Duration, error) {
		c, name := &tasks.Client{URL: s.UpstreamURL, HTTP: Client}, UpstreamTool
		if via {
			c, name = s.mcpClient(s.Callers[int(next.Add(1))%len(s.Callers)]), "up_"+UpstreamTool
		}
		r, err := c.Call(ctx, "tools/call", name, map[string]any{"name": name, "arguments": map[string]any{}})
		if err != nil {
			return 0, err
		}
		if r.Error != nil || r.HTTPStatus != http.StatusOK || !bytes.Contains(r.Result, []byte(`"content"`)) {
			return 0, fmt.Errorf("upstream call via gateway=%v: HTTP %d: %.200s", via, r.HTTPStatus, r.Raw)
		}
		return 0, nil
	}
}

// ApproveToComplete opens a task (not timed), then times the decision API
// approval until the listen stream reports the task completed: callback, status read,
// re-evaluation, claim, run, result.
func (s *System) ApproveToComplete(next *atomic.Int64) Op {
	return func(ctx context.Context, _ int) (time.Duration, error) {
		token := s.Callers[int(next.Add(1))%len(s.Callers)]
		id, err := s.task(ctx, token)
		if err != nil {
			return 0, err
		}
		backendID, err := pep.RequestOf(ctx, s.DB, id)
		if err == nil && backendID == "" {
			err = errors.New("no request bound")
		}
		if err != nil {
			return 0, fmt.Errorf("approve: backend id of %s: %w", id, err)
		}
		// The client learns of the result as a SEP-2848 client waiting for
		// it does, on a listen stream opened before the decision; polling
		// tasks/get in a loop would load the machine it measures.
		wait, stop, err := s.listen(ctx, token, id)
		if err != nil {
			return 0, err
		}
		t0 := time.Now()
		code, body, err := post(ctx, s.BackendURL+"/v1/requests/"+backendID+"/decisions", s.ITSMToken, []byte(`{"decision":"approve","reason":"bench"}`))
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("approve: HTTP %d %.200s", code, body)
		}
		if err != nil {
			stop()
			return 0, err
		}
		if err := wait(); err != nil {
			return 0, err
		}
		return time.Since(t0), nil
	}
}

// HTTPBaseline serves a trivial JSON handler on loopback: it decodes the
// body and answers a small JSON object. It returns the op and a stop func.
func HTTPBaseline() (Op, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var v map[string]any
		if err := json.NewDecoder(r.Body).Decode(&v); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"decision": false})
	})}
	go func() { _ = srv.Serve(ln) }()
	url := "http://" + ln.Addr().String() + "/"
	op := func(ctx context.Context, _ int) (time.Duration, error) {
		code, _, err := post(ctx, url, "", evaluationBody)
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("baseline: HTTP %d", code)
		}
		return 0, err
	}
	return op, func() { _ = srv.Close() }, nil
}

// InsertBaseline commits single-row INSERTs through pgx on the system's
// PostgreSQL, a connection per worker.
func (s *System) InsertBaseline(ctx context.Context, concurrency int) (Op, func(), error) {
	cfg, err := pgxpool.ParseConfig(s.DBURL)
	if err != nil {
		return nil, nil, err
	}
	cfg.MaxConns = int32(concurrency)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS public.bench_insert (id bigserial PRIMARY KEY, body jsonb NOT NULL, at timestamptz NOT NULL DEFAULT now())`); err != nil {
		pool.Close()
		return nil, nil, err
	}
	body := string(evaluationBody)
	op := func(ctx context.Context, _ int) (time.Duration, error) {
		_, err := pool.Exec(ctx, `INSERT INTO public.bench_insert (body) VALUES ($1)`, body)
		return 0, err
	}
	return op, pool.Close, nil
}

var errNoRequests = errors.New("bench: no submitted requests to read (run submit first)")

func (s *submitted) list() ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.urls) == 0 {
		return nil, errNoRequests
	}
	return append([]string(nil), s.urls...), nil
}
