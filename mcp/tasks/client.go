package tasks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
)

// Client is a minimal MCP client for the 2026-07-28 streamable HTTP
// transport that speaks the tasks extension and nothing else: it declares
// io.modelcontextprotocol/tasks, calls tools, and gets, updates and cancels
// tasks. It knows nothing about approvals: an approval-gated call is just a
// task to it.
type Client struct {
	URL   string // the MCP endpoint
	Token string // bearer token
	// NoTasks leaves the tasks extension out of the capabilities.
	NoTasks bool
	// Capabilities replaces the declared client capabilities when set.
	Capabilities map[string]any
	HTTP         *http.Client
	id           atomic.Int64
}

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

// Call sends one request and returns the response. name goes in Mcp-Name.
func (c *Client) Call(ctx context.Context, method, name string, params map[string]any) (*Response, error) {
	if params == nil {
		params = map[string]any{}
	}
	meta, _ := params["_meta"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	meta[MetaProtocolVersion] = ProtocolVersion
	meta[MetaClientCapabilities] = c.caps()
	meta["io.modelcontextprotocol/clientInfo"] = map[string]any{"name": "arap-tasks-client", "version": "0.1.0"}
	params["_meta"] = meta
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": c.id.Add(1), "method": method, "params": params})
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL, bytes.NewReader(body))
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
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 60 * time.Second}
	}
	resp, err := hc.Do(req)
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
	if err := json.Unmarshal(raw, &env); err != nil {
		return out, fmt.Errorf("tasks: HTTP %d, not a JSON-RPC response: %s", resp.StatusCode, bytes.TrimSpace(raw))
	}
	out.Result, out.Error = env.Result, env.Error
	if out.Error != nil {
		out.Error.HTTPStatus = resp.StatusCode
	}
	return out, nil
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
}

// CallTool calls a tool. extra adds params (inputResponses, requestState).
func (c *Client) CallTool(ctx context.Context, tool string, args map[string]any, extra map[string]any) (*CallResult, error) {
	params := map[string]any{"name": tool, "arguments": args}
	for k, v := range extra {
		params[k] = v
	}
	resp, err := c.Call(ctx, "tools/call", tool, params)
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
// server's pollIntervalMs.
func (c *Client) Wait(ctx context.Context, id string) (*Detailed, error) {
	for {
		d, _, err := c.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		if d.Status.Terminal() || d.Status == InputRequired {
			return d, nil
		}
		wait := time.Duration(d.PollIntervalMs) * time.Millisecond
		if wait <= 0 {
			wait = time.Second
		}
		select {
		case <-ctx.Done():
			return nil, errors.Join(ctx.Err(), fmt.Errorf("task %s still %s", id, d.Status))
		case <-time.After(wait):
		}
	}
}
