package sep2848

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// client is a minimal MCP client for the 2026-07-28 stateless HTTP
// transport: one POST per request, per-request _meta, routing headers. It
// is written from the specifications, independently of the server under
// test, and keeps every response body so the run can scan them all for
// backend artifacts.
type client struct {
	url, token string
	exts       []string // the extensions the client declares
	hc         *http.Client
	id         atomic.Int64
	seen       *transcript
}

// The extension sets a client declares: a tasks-only client (the one the
// SEP says needs no approval-specific code, and the scenarios' default),
// an approval-aware one, and none.
var (
	tasksOnly     = []string{ExtTasks}
	approvalAware = []string{ExtTasks, ExtToolApproval}
	noExtensions  = []string{}
)

// transcript is every response body a run received.
type transcript struct {
	mu     sync.Mutex
	bodies [][]byte
}

func (t *transcript) add(b []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.bodies = append(t.bodies, append([]byte(nil), b...))
}

func (t *transcript) all() [][]byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([][]byte(nil), t.bodies...)
}

// rpcError is a JSON-RPC error object.
type rpcError struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

func (e *rpcError) Error() string { return fmt.Sprintf("JSON-RPC error %d: %s", e.Code, e.Message) }

// response is one JSON-RPC response.
type response struct {
	result map[string]any
	raw    json.RawMessage // the result, as sent
	err    *rpcError
	body   []byte // the whole HTTP response body (every event of a stream)
}

func (c *client) with(token string, exts []string) *client {
	return &client{url: c.url, token: token, exts: exts, hc: c.hc, seen: c.seen}
}

// call sends one request. name is the Mcp-Name header (the tool or task).
func (c *client) call(ctx context.Context, method, name string, params map[string]any) (*response, error) {
	if params == nil {
		params = map[string]any{}
	}
	caps := map[string]any{}
	if len(c.exts) > 0 {
		ext := map[string]any{}
		for _, e := range c.exts {
			ext[e] = map[string]any{}
		}
		caps["extensions"] = ext
	}
	params["_meta"] = map[string]any{
		MetaProtocolVersion:    ProtocolVersion,
		MetaClientCapabilities: caps,
		MetaClientInfo:         map[string]any{"name": "sep-2848-conformance", "version": "1"},
	}
	return c.send(ctx, map[string]any{"jsonrpc": "2.0", "id": c.id.Add(1), "method": method, "params": params}, method, name)
}

// notify sends a notification (no id, no response expected).
func (c *client) notify(ctx context.Context, method string, params map[string]any) error {
	params["_meta"] = map[string]any{MetaProtocolVersion: ProtocolVersion}
	_, err := c.send(ctx, map[string]any{"jsonrpc": "2.0", "method": method, "params": params}, method, "")
	return err
}

func (c *client) send(ctx context.Context, msg map[string]any, method, name string) (*response, error) {
	body, err := json.Marshal(msg)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set(HeaderProtocolVersion, ProtocolVersion)
	req.Header.Set(HeaderMethod, method)
	if name != "" {
		req.Header.Set(HeaderName, name)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", method, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, fmt.Errorf("%s: read response: %w", method, err)
	}
	c.seen.add(raw)
	out := &response{body: raw}
	if _, isReq := msg["id"]; !isReq {
		return out, nil
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		raw = lastEvent(raw)
	}
	var env struct {
		Result json.RawMessage `json:"result"`
		Error  *rpcError       `json:"error"`
	}
	if err := json.Unmarshal(raw, &env); err != nil {
		return out, fmt.Errorf("%s: HTTP %d, not a JSON-RPC response: %.200s", method, resp.StatusCode, bytes.TrimSpace(raw))
	}
	out.err, out.raw = env.Error, env.Result
	if env.Result != nil {
		if err := json.Unmarshal(env.Result, &out.result); err != nil {
			return out, fmt.Errorf("%s: result is not an object: %w", method, err)
		}
	}
	return out, nil
}

// lastEvent returns the data of the last SSE event (the response).
func lastEvent(b []byte) []byte {
	var last []byte
	for _, line := range bytes.Split(b, []byte("\n")) {
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			last = bytes.TrimSpace(d)
		}
	}
	return last
}

// callTool sends tools/call with extra params (requestState, inputResponses).
func (c *client) callTool(ctx context.Context, call Call, extra map[string]any) (*response, error) {
	params := map[string]any{"name": call.Name, "arguments": call.Arguments}
	for k, v := range extra {
		params[k] = v
	}
	return c.call(ctx, MethodCall, call.Name, params)
}

// task is the part of a Task or DetailedTask the checks read.
type task struct {
	ResultType     string          `json:"resultType"`
	TaskID         string          `json:"taskId"`
	Status         string          `json:"status"`
	StatusMessage  string          `json:"statusMessage"`
	CreatedAt      time.Time       `json:"createdAt"`
	LastUpdatedAt  time.Time       `json:"lastUpdatedAt"`
	TTLMs          *int64          `json:"ttlMs"`
	PollIntervalMs int             `json:"pollIntervalMs"`
	Result         json.RawMessage `json:"result"`
	InputRequests  map[string]any  `json:"inputRequests"`
	Meta           map[string]any  `json:"_meta"`
	hasTTL         bool
}

func asTask(r *response) (*task, error) {
	if r.err != nil {
		return nil, r.err
	}
	var t task
	if err := json.Unmarshal(r.raw, &t); err != nil {
		return nil, fmt.Errorf("not a task: %w", err)
	}
	_, t.hasTTL = r.result["ttlMs"]
	return &t, nil
}

func (c *client) get(ctx context.Context, id string) (*task, error) {
	r, err := c.call(ctx, MethodGet, id, map[string]any{"taskId": id})
	if err != nil {
		return nil, err
	}
	return asTask(r)
}

// toolResult is a CallToolResult.
type toolResult struct {
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	IsError bool           `json:"isError"`
	Meta    map[string]any `json:"_meta"`
}

func (r *toolResult) text() string {
	var b strings.Builder
	for _, c := range r.Content {
		if c.Type == "text" {
			b.WriteString(c.Text)
			b.WriteString("\n")
		}
	}
	return b.String()
}

func (t *task) toolResult() (*toolResult, error) {
	if len(t.Result) == 0 {
		return nil, fmt.Errorf("task %s is %s with no result", t.TaskID, t.Status)
	}
	var r toolResult
	if err := json.Unmarshal(t.Result, &r); err != nil {
		return nil, fmt.Errorf("task %s: result is not a CallToolResult: %w", t.TaskID, err)
	}
	return &r, nil
}

// wait polls tasks/get until the task is terminal (or until is true of it),
// honouring pollIntervalMs within [50ms, 2s]. Like a durable client, it
// keeps polling through transport errors (a server restarting), until ctx
// ends; a JSON-RPC error ends the wait.
func (c *client) wait(ctx context.Context, id string, until func(*task) bool) (*task, error) {
	return c.watch(ctx, id, until, nil)
}

// watch is wait, showing every task read to seen.
func (c *client) watch(ctx context.Context, id string, until func(*task) bool, seen func(*task)) (*task, error) {
	if until == nil {
		until = terminal
	}
	var last error
	for {
		r, err := c.call(ctx, MethodGet, id, map[string]any{"taskId": id})
		d := time.Second
		if err == nil {
			t, err := asTask(r)
			if err != nil {
				return nil, err
			}
			if seen != nil {
				seen(t)
			}
			if until(t) {
				return t, nil
			}
			last = fmt.Errorf("task %s still %s", id, t.Status)
			d = min(max(time.Duration(t.PollIntervalMs)*time.Millisecond, 50*time.Millisecond), 2*time.Second)
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %w", last, ctx.Err())
		case <-time.After(d):
		}
	}
}

func terminal(t *task) bool {
	return t.Status == StatusCompleted || t.Status == StatusFailed || t.Status == StatusCancelled
}
