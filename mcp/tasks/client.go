package tasks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Client is a minimal MCP client for the 2026-07-28 streamable HTTP
// transport that speaks the tasks extension and nothing else: it declares
// io.modelcontextprotocol/tasks, lists and calls tools, and gets, updates
// and cancels tasks. It knows nothing about approvals: an approval-gated
// call is just a task to it.
type Client struct {
	URL   string // the MCP endpoint
	Token string // bearer token
	// Auth, instead of Token, gets access tokens by the MCP authorization
	// specification's OAuth flow (the go-sdk's auth.AuthorizationCodeHandler):
	// a request answered 401 or 403 runs it, then goes once more.
	Auth auth.OAuthHandler
	// NoTasks leaves the tasks extension out of the capabilities.
	NoTasks bool
	// Capabilities replaces the declared client capabilities when set.
	Capabilities map[string]any
	HTTP         *http.Client
	id           atomic.Int64

	mu      sync.Mutex
	version string               // negotiated protocol version; "" is ProtocolVersion
	tools   map[string]*toolInfo // from the last complete tools/list; nil before one
}

// supportedVersions are the protocol versions this client speaks, preferred
// first.
var supportedVersions = []string{ProtocolVersion}

// ErrNotMCP: the URL answered, but not as an MCP endpoint does (a
// backend's base URL, a web page, a proxy's error).
var ErrNotMCP = errors.New("is it an MCP endpoint?")

// ErrNoCommonVersion: the server speaks none of the client's versions.
var ErrNoCommonVersion = errors.New("no protocol version in common with the server")

// RPCError is a JSON-RPC error response.
type RPCError struct {
	HTTPStatus int
	Code       int             `json:"code"`
	Message    string          `json:"message"`
	Data       json.RawMessage `json:"data,omitempty"`
}

func (e *RPCError) Error() string { return fmt.Sprintf("JSON-RPC error %d: %s", e.Code, e.Message) }

// Response is a raw JSON-RPC response, with the HTTP status and raw bytes
// (tests scan them).
type Response struct {
	HTTPStatus int
	Raw        []byte
	Result     json.RawMessage
	Error      *RPCError
}

func (c *Client) caps() map[string]any {
	if c.Capabilities != nil {
		return c.Capabilities
	}
	if c.NoTasks {
		return map[string]any{}
	}
	return map[string]any{"extensions": map[string]any{ExtensionID: map[string]any{}}}
}

func (c *Client) protocolVersion() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.version == "" {
		return ProtocolVersion
	}
	return c.version
}

// Call sends one request and returns the response. name goes in Mcp-Name.
// When the server refuses the protocol version (-32022), the request is
// sent once more with the first version of data.supported that this client
// speaks, which later requests keep using; with none in common, the error
// wraps ErrNoCommonVersion.
func (c *Client) Call(ctx context.Context, method, name string, params map[string]any) (*Response, error) {
	return c.call(ctx, method, name, params, nil)
}

func (c *Client) call(ctx context.Context, method, name string, params map[string]any, headers map[string]string) (*Response, error) {
	if params == nil {
		params = map[string]any{}
	}
	version := c.protocolVersion()
	resp, err := c.send(ctx, method, name, params, headers, version)
	if err != nil || resp.Error == nil || resp.Error.Code != CodeUnsupportedProtocolVersion {
		return resp, err
	}
	var data struct {
		Supported []string `json:"supported"`
	}
	_ = json.Unmarshal(resp.Error.Data, &data) // no list: no version in common
	i := slices.IndexFunc(data.Supported, func(v string) bool { return slices.Contains(supportedVersions, v) })
	if i < 0 {
		return resp, fmt.Errorf("%s: the server refused protocol version %s and supports %q; this client supports %q: %w",
			method, version, data.Supported, supportedVersions, ErrNoCommonVersion)
	}
	c.mu.Lock()
	c.version = data.Supported[i]
	c.mu.Unlock()
	return c.send(ctx, method, name, params, headers, data.Supported[i]) // one retry, never a loop
}

func (c *Client) send(ctx context.Context, method, name string, params map[string]any, headers map[string]string, version string) (*Response, error) {
	meta, _ := params["_meta"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	meta[MetaProtocolVersion] = version
	meta[MetaClientCapabilities] = c.caps()
	meta[MetaClientInfo] = map[string]any{"name": "arap-tasks-client", "version": "0.1.0"}
	params["_meta"] = meta
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": c.id.Add(1), "method": method, "params": params})
	if err != nil {
		return nil, err
	}
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 60 * time.Second}
	}
	resp, err := c.post(ctx, hc, body, method, name, headers, version)
	if err == nil && c.Auth != nil && (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden) {
		if err := c.Auth.Authorize(ctx, resp.Request, resp); err != nil { // it closes the body
			return nil, fmt.Errorf("tasks: authorization: %w", err)
		}
		resp, err = c.post(ctx, hc, body, method, name, headers, version)
	}
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, err
	}
	out := &Response{HTTPStatus: resp.StatusCode, Raw: raw}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		raw = lastData(raw)
	}
	var env struct {
		Result json.RawMessage `json:"result"`
		Error  *RPCError       `json:"error"`
	}
	if err := json.Unmarshal(raw, &env); err != nil || (env.Result == nil && env.Error == nil) {
		return out, fmt.Errorf("tasks: %s answered HTTP %d, not a JSON-RPC response (%.120s): %w", c.URL, resp.StatusCode, bytes.TrimSpace(raw), ErrNotMCP)
	}
	out.Result, out.Error = env.Result, env.Error
	if out.Error != nil {
		out.Error.HTTPStatus = resp.StatusCode
	}
	return out, nil
}

// post sends one request body with the headers of its method and
// protocol version and the caller's credentials.
func (c *Client) post(ctx context.Context, hc *http.Client, body []byte, method, name string, headers map[string]string, version string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set(HeaderProtocolVersion, version)
	req.Header.Set(HeaderMethod, method)
	if name != "" {
		req.Header.Set(HeaderName, EncodeHeaderValue(name))
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	switch {
	case c.Auth != nil:
		ts, err := c.Auth.TokenSource(ctx)
		if err != nil {
			return nil, fmt.Errorf("tasks: authorization: %w", err)
		}
		if ts != nil {
			tok, err := ts.Token()
			if err != nil {
				return nil, fmt.Errorf("tasks: access token: %w", err)
			}
			tok.SetAuthHeader(req)
		}
	case c.Token != "":
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	return hc.Do(req)
}

// lastData returns the last data line of an SSE body (the response).
func lastData(b []byte) []byte {
	var last []byte
	for _, line := range bytes.Split(b, []byte("\n")) {
		if d, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
			last = d
		}
	}
	return last
}

// CallResult is what tools/call returned: a task, an MRTR input request, or
// a final result (Raw holds it whole).
type CallResult struct {
	ResultType    string          `json:"resultType"`
	Task          *Detailed       `json:"-"`
	InputRequests map[string]any  `json:"inputRequests,omitempty"`
	RequestState  string          `json:"requestState,omitempty"`
	IsError       bool            `json:"isError,omitempty"`
	Raw           json.RawMessage `json:"-"`
	// hasState: the server sent requestState (possibly ""), so a retry
	// echoes it; without one, a retry sends none.
	hasState bool
}

// CallTool calls a tool, mirroring its x-mcp-header parameters into
// Mcp-Param headers. The first call of a client lists the tools to learn
// them; a tool whose definition was rejected is refused (ErrInvalidTool)
// without being called. When the listing itself fails, the call goes out
// without Mcp-Param headers and the server judges it. extra adds params.
func (c *Client) CallTool(ctx context.Context, tool string, args map[string]any, extra map[string]any) (*CallResult, error) {
	c.mu.Lock()
	listed := c.tools != nil
	c.mu.Unlock()
	if !listed {
		_, _, _ = c.ListTools(ctx) // a failure leaves the tool unknown; the call says what is wrong
	}
	var headers map[string]string
	c.mu.Lock()
	info := c.tools[tool]
	c.mu.Unlock()
	if info != nil {
		if info.invalid != nil {
			return nil, fmt.Errorf("tool %s: %w: %v", tool, ErrInvalidTool, info.invalid)
		}
		var err error
		if headers, err = paramHeaderValues(info.headers, args); err != nil {
			return nil, fmt.Errorf("tool %s: %w", tool, err)
		}
	}
	params := map[string]any{"name": tool, "arguments": args}
	for k, v := range extra {
		params[k] = v
	}
	resp, err := c.call(ctx, "tools/call", tool, params, headers)
	if err != nil {
		return nil, err
	}
	if resp.Error != nil {
		return nil, resp.Error
	}
	var cr CallResult
	if err := json.Unmarshal(resp.Result, &cr); err != nil {
		return nil, err
	}
	var state struct {
		RequestState *string `json:"requestState"`
	}
	_ = json.Unmarshal(resp.Result, &state) // it parsed above
	cr.hasState = state.RequestState != nil
	cr.Raw = resp.Result
	if cr.ResultType == ResultTypeTask {
		var d Detailed
		if err := json.Unmarshal(resp.Result, &d); err != nil {
			return nil, err
		}
		cr.Task = &d
	}
	return &cr, nil
}

// Retry answers an MRTR input request (prev, an input_required result of
// tools/call) by calling the tool again with the responses, echoing
// prev's requestState exactly, and sending none when prev had none.
func (c *Client) Retry(ctx context.Context, tool string, args map[string]any, prev *CallResult, responses map[string]any) (*CallResult, error) {
	extra := map[string]any{"inputResponses": responses}
	if prev.hasState {
		extra["requestState"] = prev.RequestState
	}
	return c.CallTool(ctx, tool, args, extra)
}

// Tool is a tool as tools/list described it; InputSchema is kept verbatim.
type Tool struct {
	Name         string          `json:"name"`
	Title        string          `json:"title,omitempty"`
	Description  string          `json:"description,omitempty"`
	InputSchema  json.RawMessage `json:"inputSchema,omitempty"`
	OutputSchema json.RawMessage `json:"outputSchema,omitempty"`
	Annotations  json.RawMessage `json:"annotations,omitempty"`
	Raw          json.RawMessage `json:"-"`
}

// RejectedTool is a tool left out of the list, and why.
type RejectedTool struct {
	Name   string
	Reason error
}

type toolInfo struct {
	headers []paramHeader
	invalid error
}

// maxToolPages bounds tools/list pagination: a server that pages forever
// is not followed.
const maxToolPages = 20

// ListTools reads every page of tools/list (at most maxToolPages) and
// returns the valid tools in the server's order, and the rejected ones:
// those with an invalid x-mcp-header annotation, which the client will not
// call. The client remembers the listing for CallTool.
func (c *Client) ListTools(ctx context.Context) ([]Tool, []RejectedTool, error) {
	var tools []Tool
	var rejected []RejectedTool
	infos := map[string]*toolInfo{}
	params := map[string]any{}
	for page := 0; ; page++ {
		if page == maxToolPages {
			return nil, nil, fmt.Errorf("tools/list: more than %d pages", maxToolPages)
		}
		resp, err := c.Call(ctx, "tools/list", "", params)
		if err != nil {
			return nil, nil, fmt.Errorf("tools/list: %w", err)
		}
		if resp.Error != nil {
			return nil, nil, fmt.Errorf("tools/list: %w", resp.Error)
		}
		var res struct {
			Tools      []json.RawMessage `json:"tools"`
			NextCursor string            `json:"nextCursor"`
		}
		if err := json.Unmarshal(resp.Result, &res); err != nil {
			return nil, nil, fmt.Errorf("tools/list: %w", err)
		}
		for _, raw := range res.Tools {
			var t Tool
			if err := json.Unmarshal(raw, &t); err != nil {
				return nil, nil, fmt.Errorf("tools/list: %w", err)
			}
			t.Raw = raw
			hs, err := toolHeaders(t.InputSchema)
			infos[t.Name] = &toolInfo{headers: hs, invalid: err}
			if err != nil {
				rejected = append(rejected, RejectedTool{Name: t.Name, Reason: err})
				continue
			}
			tools = append(tools, t)
		}
		if res.NextCursor == "" {
			break
		}
		params = map[string]any{"cursor": res.NextCursor}
	}
	c.mu.Lock()
	c.tools = infos
	c.mu.Unlock()
	return tools, rejected, nil
}

// Get reads a task.
func (c *Client) Get(ctx context.Context, id string) (*Detailed, json.RawMessage, error) {
	resp, err := c.Call(ctx, MethodGet, id, map[string]any{"taskId": id})
	if err != nil {
		return nil, nil, err
	}
	if resp.Error != nil {
		return nil, nil, resp.Error
	}
	var d Detailed
	if err := json.Unmarshal(resp.Result, &d); err != nil {
		return nil, nil, err
	}
	return &d, resp.Result, nil
}

// Update answers input requests of a task.
func (c *Client) Update(ctx context.Context, id string, responses map[string]any) error {
	resp, err := c.Call(ctx, MethodUpdate, id, map[string]any{"taskId": id, "inputResponses": responses})
	if err != nil {
		return err
	}
	if resp.Error != nil {
		return resp.Error
	}
	return nil
}

// Cancel asks for a task to be cancelled.
func (c *Client) Cancel(ctx context.Context, id string) error {
	resp, err := c.Call(ctx, MethodCancel, id, map[string]any{"taskId": id})
	if err != nil {
		return err
	}
	if resp.Error != nil {
		return resp.Error
	}
	return nil
}

// Wait polls a task until it is terminal or needs input, honouring the
// server's pollIntervalMs. An answer that the server is temporarily
// unavailable (CodeUnavailable) is waited out: Wait asks again after the
// seconds it names, until ctx ends.
func (c *Client) Wait(ctx context.Context, id string) (*Detailed, error) {
	for {
		d, _, err := c.Get(ctx, id)
		var wait time.Duration
		switch {
		case err != nil:
			if wait = retryAfter(err); wait == 0 {
				return nil, err
			}
		case d.Status.Terminal() || d.Status == InputRequired:
			return d, nil
		default:
			wait = time.Duration(d.PollIntervalMs) * time.Millisecond
		}
		if wait <= 0 {
			wait = time.Second
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return nil, errors.Join(ctx.Err(), err)
			}
			return nil, errors.Join(ctx.Err(), fmt.Errorf("task %s still %s", id, d.Status))
		case <-time.After(wait):
		}
	}
}

// retryAfter is the wait a CodeUnavailable error asks for (its
// data.retryAfterSeconds, 1 to 60 seconds; 2 when absent or out of
// range), or 0 for any other error.
func retryAfter(err error) time.Duration {
	var re *RPCError
	if !errors.As(err, &re) || re.Code != CodeUnavailable {
		return 0
	}
	var data map[string]any
	_ = json.Unmarshal(re.Data, &data)
	if n, ok := data[DataRetryAfter].(float64); ok && n >= 1 && n <= 60 {
		return time.Duration(n) * time.Second
	}
	return 2 * time.Second
}
