package tasks_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/mcp/tasks"
)

// seen is one request a scripted server received.
type seen struct {
	Method  string
	Params  map[string]any
	Header  http.Header
	Version string // _meta protocolVersion
}

// scripted serves JSON-RPC on loopback: answer gives each request's
// result or error (the n-th request counts from 0), and every request is
// recorded.
func scripted(t *testing.T, answer func(n int, r seen) map[string]any) (*httptest.Server, func() []seen) {
	t.Helper()
	var mu sync.Mutex
	var got []seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			ID     int64          `json:"id"`
			Method string         `json:"method"`
			Params map[string]any `json:"params"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		meta, _ := req.Params["_meta"].(map[string]any)
		v, _ := meta[tasks.MetaProtocolVersion].(string)
		s := seen{Method: req.Method, Params: req.Params, Header: r.Header.Clone(), Version: v}
		mu.Lock()
		n := len(got)
		got = append(got, s)
		mu.Unlock()
		body := answer(n, s)
		body["jsonrpc"], body["id"] = "2.0", req.ID
		w.Header().Set("Content-Type", "application/json")
		if _, isErr := body["error"]; isErr {
			w.WriteHeader(http.StatusBadRequest)
		}
		_ = json.NewEncoder(w).Encode(body)
	}))
	t.Cleanup(srv.Close)
	return srv, func() []seen {
		mu.Lock()
		defer mu.Unlock()
		return append([]seen(nil), got...)
	}
}

func unsupported(supported ...string) map[string]any {
	return map[string]any{"error": map[string]any{"code": tasks.CodeUnsupportedProtocolVersion,
		"message": "Unsupported protocol version", "data": map[string]any{"supported": supported, "requested": "x"}}}
}

// TestClientRetriesWithSupportedVersion: after -32022 the client sends the
// request once more with the version data.supported offers that it speaks
// (header and _meta agreeing), keeps it for later requests, and never
// loops.
func TestClientRetriesWithSupportedVersion(t *testing.T) {
	t.Parallel()
	srv, got := scripted(t, func(n int, r seen) map[string]any {
		if n == 0 {
			return unsupported("2099-01-01", tasks.ProtocolVersion)
		}
		return map[string]any{"result": map[string]any{"tools": []any{}}}
	})
	c := &tasks.Client{URL: srv.URL, Token: "t"}
	resp, err := c.Call(context.Background(), "tools/list", "", nil)
	require.NoError(t, err)
	require.Nil(t, resp.Error)
	_, err = c.Call(context.Background(), "tools/list", "", nil)
	require.NoError(t, err)
	reqs := got()
	require.Len(t, reqs, 3, "one refusal, one retry, one later request")
	for _, r := range reqs {
		require.Equal(t, tasks.ProtocolVersion, r.Version)
		require.Equal(t, tasks.ProtocolVersion, r.Header.Get(tasks.HeaderProtocolVersion))
	}
}

// TestClientRetryIsBounded: a server that refuses every request gets one
// retry, then the client gives up with the server's error.
func TestClientRetryIsBounded(t *testing.T) {
	t.Parallel()
	srv, got := scripted(t, func(int, seen) map[string]any { return unsupported(tasks.ProtocolVersion) })
	c := &tasks.Client{URL: srv.URL, Token: "t"}
	resp, err := c.Call(context.Background(), "tools/list", "", nil)
	require.NoError(t, err)
	require.NotNil(t, resp.Error)
	require.Equal(t, tasks.CodeUnsupportedProtocolVersion, resp.Error.Code)
	require.Len(t, got(), 2)
}

// TestClientNoCommonVersion: when data.supported offers only versions the
// client does not speak, it does not retry and says why.
func TestClientNoCommonVersion(t *testing.T) {
	t.Parallel()
	srv, got := scripted(t, func(int, seen) map[string]any { return unsupported("2024-11-05") })
	c := &tasks.Client{URL: srv.URL, Token: "t"}
	_, err := c.Call(context.Background(), "tools/list", "", nil)
	require.ErrorIs(t, err, tasks.ErrNoCommonVersion)
	require.ErrorContains(t, err, "2024-11-05")
	require.Len(t, got(), 1)
}

// mrtrServer lists one tool and answers its first call with an
// input_required result carrying state (nil: no requestState member).
func mrtrServer(t *testing.T, state *string) (*httptest.Server, func() []seen) {
	return scripted(t, func(n int, r seen) map[string]any {
		if r.Method == "tools/list" {
			return map[string]any{"result": map[string]any{"tools": []any{map[string]any{"name": "ask", "inputSchema": map[string]any{"type": "object"}}}}}
		}
		if _, answered := r.Params["inputResponses"]; answered {
			return map[string]any{"result": map[string]any{"resultType": "complete", "content": []any{}}}
		}
		res := map[string]any{"resultType": tasks.ResultTypeInputRequired,
			"inputRequests": map[string]any{"q": map[string]any{"method": "elicitation/create", "params": map[string]any{"message": "?"}}}}
		if state != nil {
			res["requestState"] = *state
		}
		return map[string]any{"result": res}
	})
}

// TestClientRetryRequestState: an MRTR retry echoes the server's
// requestState exactly (even an empty one), and carries none when the
// server sent none.
func TestClientRetryRequestState(t *testing.T) {
	t.Parallel()
	for name, state := range map[string]*string{"absent": nil, "empty": new(string), "opaque": ptr(`{"n":1} `)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv, got := mrtrServer(t, state)
			c := &tasks.Client{URL: srv.URL, Token: "t"}
			r, err := c.CallTool(context.Background(), "ask", map[string]any{}, nil)
			require.NoError(t, err)
			require.Equal(t, tasks.ResultTypeInputRequired, r.ResultType)
			r, err = c.Retry(context.Background(), "ask", map[string]any{}, r, map[string]any{"q": map[string]any{"action": "accept"}})
			require.NoError(t, err)
			require.Equal(t, tasks.ResultTypeComplete, r.ResultType)
			reqs := got()
			last := reqs[len(reqs)-1]
			require.Contains(t, last.Params, "inputResponses")
			sent, has := last.Params["requestState"]
			if state == nil {
				require.False(t, has, "requestState sent though the server sent none: %v", sent)
				return
			}
			require.True(t, has)
			require.Equal(t, *state, sent)
		})
	}
}

func ptr(s string) *string { return &s }
