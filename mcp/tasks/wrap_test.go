package tasks_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/mcp/tasks"
)

// acted records the task methods the SDK actually ran, with the taskId it
// decoded.
type acted struct {
	mu    sync.Mutex
	calls []string // "method taskId"
}

func (a *acted) add(method, id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls = append(a.calls, method+" "+id)
}

func (a *acted) take() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := a.calls
	a.calls = nil
	return out
}

// behindWrap is the real SDK streamable handler (stateless, as the
// front-end runs it) with tasks/get, tasks/update and tasks/cancel as
// recording stubs, behind the wrapper.
func behindWrap(t testing.TB) (http.Handler, *acted) {
	t.Helper()
	a := &acted{}
	s := sdk.NewServer(&sdk.Implementation{Name: "t", Version: "0"}, nil)
	ack := &tasks.AckResult{ResultType: tasks.ResultTypeComplete}
	for _, m := range []string{tasks.MethodGet, tasks.MethodCancel} {
		require.NoError(t, sdk.AddReceivingCustomMethod(s, m, func(_ context.Context, _ *sdk.ServerSession, p *tasks.TaskParams) (*tasks.AckResult, error) {
			a.add(m, p.TaskID)
			return ack, nil
		}))
	}
	require.NoError(t, sdk.AddReceivingCustomMethod(s, tasks.MethodUpdate, func(_ context.Context, _ *sdk.ServerSession, p *tasks.UpdateParams) (*tasks.AckResult, error) {
		a.add(tasks.MethodUpdate, p.TaskID)
		return ack, nil
	}))
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, &sdk.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	return (&tasks.Server{}).Wrap(h), a
}

func post(h http.Handler, body, method, name string) (int, map[string]any) {
	// Bounded, should a fuzzed body open a stream the SDK serves.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/mcp", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set(tasks.HeaderProtocolVersion, tasks.ProtocolVersion)
	req.Header.Set(tasks.HeaderMethod, method)
	req.Header.Set(tasks.HeaderName, name)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var out map[string]any
	_ = json.Unmarshal(rec.Body.Bytes(), &out)
	return rec.Code, out
}

const meta = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}`

func get(params string) string {
	return `{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{` + params + `,` + meta + `}}`
}

// TestWrapReadsTheBodyAsTheSDKDoes: the Mcp-Name check and the SDK can
// never read different taskIds (or methods): bodies they could read
// differently are refused before the SDK sees them, and what passes is
// what the SDK acts on.
func TestWrapReadsTheBodyAsTheSDKDoes(t *testing.T) {
	t.Parallel()
	h, a := behindWrap(t)

	t.Run("a plain request passes, and the SDK acts on the checked id", func(t *testing.T) {
		status, out := post(h, get(`"taskId":"tsk_A"`), tasks.MethodGet, "tsk_A")
		require.Equal(t, http.StatusOK, status, out)
		require.Equal(t, []string{"tasks/get tsk_A"}, a.take())
		// An escaped member name is the same name to both readers.
		status, out = post(h, get(`"task\u0049d":"tsk_A"`), tasks.MethodGet, "tsk_A")
		require.Equal(t, http.StatusOK, status, out)
		require.Equal(t, []string{"tasks/get tsk_A"}, a.take())
	})

	t.Run("a header that does not match is refused", func(t *testing.T) {
		status, out := post(h, get(`"taskId":"tsk_A"`), tasks.MethodGet, "tsk_B")
		require.Equal(t, http.StatusBadRequest, status)
		require.EqualValues(t, tasks.CodeHeaderMismatch, out["error"].(map[string]any)["code"])
		require.Empty(t, a.take())
	})

	// Each of these names tsk_B in the header while the SDK would act on
	// tsk_A (or a method the check does not cover); encoding/json, which the
	// check used to decode with, reads tsk_B (see oldCheckPasses).
	refused := []struct {
		name, body, method string
		code               int
		oldPassed          bool
	}{
		{"taskId then TaskId", get(`"taskId":"tsk_A","TaskId":"tsk_B"`), tasks.MethodGet, tasks.CodeInvalidRequest, true},
		{"TaskId then taskId", get(`"TaskId":"tsk_B","taskId":"tsk_A"`), tasks.MethodGet, tasks.CodeInvalidRequest, false},
		{"TaskId alone", get(`"TaskId":"tsk_B"`), tasks.MethodGet, tasks.CodeInvalidRequest, true},
		{"a Unicode case variant", get(`"taskId":"tsk_A","taſkId":"tsk_B"`), tasks.MethodGet, tasks.CodeInvalidRequest, true},
		{"duplicate taskId, B last", get(`"taskId":"tsk_A","taskId":"tsk_B"`), tasks.MethodGet, tasks.CodeInvalidRequest, true},
		{"duplicate taskId, B first", get(`"taskId":"tsk_B","taskId":"tsk_A"`), tasks.MethodGet, tasks.CodeInvalidRequest, false},
		{"duplicate taskId, one escaped", get(`"taskId":"tsk_B","task\u0049d":"tsk_A"`), tasks.MethodGet, tasks.CodeInvalidRequest, false},
		{"a case variant of params", `{"jsonrpc":"2.0","id":1,"method":"tasks/cancel","params":{"taskId":"tsk_A",` + meta + `},"Params":{"taskId":"tsk_B"}}`,
			tasks.MethodCancel, tasks.CodeInvalidRequest, true},
		{"a case variant of method", `{"jsonrpc":"2.0","id":1,"method":"tasks/cancel","Method":"tools/list","params":{"taskId":"tsk_A",` + meta + `}}`,
			tasks.MethodCancel, tasks.CodeInvalidRequest, true},
		{"data after the request", get(`"taskId":"tsk_A"`) + ` x`, tasks.MethodGet, tasks.CodeParseError, true},
		{"two requests in one body", get(`"taskId":"tsk_A"`) + get(`"taskId":"tsk_B"`), tasks.MethodGet, tasks.CodeParseError, true},
		{"a member encoding/json cannot type", get(`"taskId":"tsk_A","notifications":5`), tasks.MethodGet, tasks.CodeHeaderMismatch, true},
		{"tasks methods in a batch", `[` + get(`"taskId":"tsk_A"`) + `]`, tasks.MethodGet, tasks.CodeInvalidRequest, true},
	}
	for _, c := range refused {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.oldPassed, oldCheckPasses(c.body, "tsk_B"), "what the former check made of it")
			status, out := post(h, c.body, c.method, "tsk_B")
			require.Equal(t, http.StatusBadRequest, status, out)
			require.EqualValues(t, c.code, out["error"].(map[string]any)["code"], out)
			require.Empty(t, a.take(), "the SDK never saw it")
		})
	}
}

// oldCheckPasses is the former check: the body decoded with encoding/json
// into the wrapper's envelope struct (case-insensitive member names, the
// last duplicate wins, and on any decoding error the request went on to the
// SDK unchecked).
func oldCheckPasses(body, name string) bool {
	var env struct {
		Method string `json:"method"`
		Params struct {
			TaskID        *string `json:"taskId"`
			Notifications *struct {
				TaskIDs []string `json:"taskIds"`
			} `json:"notifications"`
		} `json:"params"`
	}
	if json.Unmarshal([]byte(body), &env) != nil {
		return true
	}
	switch env.Method {
	case tasks.MethodGet, tasks.MethodUpdate, tasks.MethodCancel:
		return env.Params.TaskID != nil && *env.Params.TaskID == name
	}
	return true
}

// FuzzWrapEnvelope: whatever the wrapper lets through, a task method the
// SDK runs acts on exactly the taskId the Mcp-Name header names.
func FuzzWrapEnvelope(f *testing.F) {
	for _, params := range []string{
		`"taskId":"tsk_A"`, `"taskId":"tsk_A","TaskId":"tsk_B"`, `"TaskId":"tsk_B","taskId":"tsk_A"`,
		`"taskId":"tsk_A","taskId":"tsk_B"`, `"taskId":"tsk_B","taskId":"tsk_A"`, `"task\u0049d":"tsk_B"`,
		`"taskId":"tsk_A","notifications":5`, `"taskId":"tsk_A","inputResponses":{"k":{"action":"accept"}}`,
	} {
		for _, m := range []string{tasks.MethodGet, tasks.MethodUpdate, tasks.MethodCancel} {
			body := strings.Replace(get(params), tasks.MethodGet, m, 1)
			f.Add([]byte(body), "tsk_B", m)
			f.Add([]byte(body+" x"), "tsk_B", m)
			f.Add([]byte("["+body+"]"), "tsk_B", m)
		}
	}
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"method":"tasks/get","Method":"tools/list","params":{"taskId":"tsk_A",`+meta+`}}`), "tsk_B", tasks.MethodGet)
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"tsk_A",`+meta+`},"Params":{"taskId":"tsk_B"}}`), "tsk_B", tasks.MethodGet)
	h, a := behindWrap(f)
	f.Fuzz(func(t *testing.T, body []byte, name, method string) {
		if !validHeader(name) || !validHeader(method) {
			return
		}
		post(h, string(bytes.Clone(body)), method, name)
		for _, c := range a.take() {
			m, id, _ := strings.Cut(c, " ")
			require.Equal(t, name, id, "%s acted on a taskId the header did not name; body %q", m, body)
			require.Equal(t, method, m)
		}
	})
}

// validHeader reports whether v can travel as an HTTP header value.
func validHeader(v string) bool {
	for _, r := range v {
		if r < 0x20 || r == 0x7f || r > 0x7e {
			return false
		}
	}
	return true
}
