package tasks_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/mcp/tasks"
)

// TestClientWaitHonoursPollInterval serves a task that stays working for a
// few polls, with the interval the server asks for, and checks the client
// never polls sooner, declares the tasks extension on every request, and
// returns the completed task.
func TestClientWaitHonoursPollInterval(t *testing.T) {
	const interval = 150 * time.Millisecond
	var mu sync.Mutex
	var polls []time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			ID     int64          `json:"id"`
			Method string         `json:"method"`
			Params map[string]any `json:"params"`
		}
		require.NoError(t, json.NewDecoder(r.Body).Decode(&req))
		require.Equal(t, tasks.MethodGet, req.Method)
		require.Equal(t, tasks.MethodGet, r.Header.Get(tasks.HeaderMethod))
		require.Equal(t, "tsk_1", r.Header.Get(tasks.HeaderName))
		caps := req.Params["_meta"].(map[string]any)[tasks.MetaClientCapabilities].(map[string]any)
		require.Contains(t, caps["extensions"], tasks.ExtensionID)
		mu.Lock()
		polls = append(polls, time.Now())
		n := len(polls)
		mu.Unlock()
		task := map[string]any{"taskId": "tsk_1", "status": "working", "createdAt": "2026-11-29T00:00:00Z",
			"lastUpdatedAt": "2026-11-29T00:00:00Z", "ttlMs": nil, "pollIntervalMs": interval.Milliseconds()}
		if n == 4 {
			task["status"] = "completed"
			task["result"] = map[string]any{"content": []any{map[string]any{"type": "text", "text": "done"}}}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": task})
	}))
	defer srv.Close()

	c := &tasks.Client{URL: srv.URL, Token: "t"}
	d, err := c.Wait(context.Background(), "tsk_1")
	require.NoError(t, err)
	require.Equal(t, tasks.Completed, d.Status)
	require.JSONEq(t, `{"content":[{"type":"text","text":"done"}]}`, string(d.Result))
	require.Len(t, polls, 4)
	for i := 1; i < len(polls); i++ {
		require.GreaterOrEqual(t, polls[i].Sub(polls[i-1]), interval, "poll %d came sooner than pollIntervalMs", i)
	}

	// A context that ends stops the wait and says where the task was. It
	// ends once the first poll's answer is in (not on a timer, which a
	// loaded machine could outrun with that poll itself).
	mu.Lock()
	polls = nil
	mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.HTTP = &http.Client{Transport: cancelAfter{cancel}}
	_, err = c.Wait(ctx, "tsk_1")
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, "still working")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, polls, 1)
}

// cancelAfter reads a whole response, then cancels the caller's context.
type cancelAfter struct{ cancel context.CancelFunc }

func (c cancelAfter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	c.cancel()
	return resp, nil
}

// TestNotAnMCPEndpointSaysSo: a URL that answers with something other than
// JSON-RPC (the backend's base URL, a web page) is ErrNotMCP, naming the URL.
func TestNotAnMCPEndpointSaysSo(t *testing.T) {
	for _, body := range []string{"<html>hello</html>", `{"error":"not here"}`} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, body)
		}))
		c := &tasks.Client{URL: srv.URL + "/v1"}
		_, err := c.Call(context.Background(), "tools/list", "", nil)
		srv.Close()
		require.ErrorIs(t, err, tasks.ErrNotMCP, body)
		require.Contains(t, err.Error(), srv.URL+"/v1 answered HTTP 200", body)
	}
}
