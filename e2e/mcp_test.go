package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/mcp/tasks"
)

// recorder keeps every response body an MCP client received, so a test can
// scan them for backend artifacts.
type recorder struct {
	mu     sync.Mutex
	bodies [][]byte
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	r.mu.Lock()
	r.bodies = append(r.bodies, b)
	r.mu.Unlock()
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return resp, nil
}

// scan fails if any recorded response carries something only the backend
// and the PEP may see.
func (r *recorder) scan(t *testing.T, backendURL string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	require.NotEmpty(t, r.bodies)
	// requestState is sealed ciphertext (base64url): it can spell "bob" by
	// chance and reveals nothing, so it is not scanned.
	sealed := regexp.MustCompile(`"requestState":"[^"]*"`)
	for _, b := range r.bodies {
		s := sealed.ReplaceAllString(string(b), `"requestState":""`)
		for _, bad := range []string{`"binding_token"`, `"evaluation_id"`, `"approval"`, `"access_request"`, `"state":"ey`, "eyJ",
			backendURL, "/access/v1/", "arq_", "apr_", "user:", "client:", "itsm", "bob", "carol"} {
			require.NotContains(t, s, bad, "an MCP response carried a backend artifact or an approver's identity")
		}
	}
}

func meta(raw json.RawMessage) map[string]any {
	var m struct {
		Meta map[string]any `json:"_meta"`
	}
	_ = json.Unmarshal(raw, &m)
	return m.Meta
}

func resultText(t *testing.T, d *tasks.Detailed) (string, map[string]any, bool) {
	t.Helper()
	var r struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
		IsError bool           `json:"isError"`
		Meta    map[string]any `json:"_meta"`
	}
	require.NoError(t, json.Unmarshal(d.Result, &r))
	var texts []string
	for _, c := range r.Content {
		texts = append(texts, c.Text)
	}
	return strings.Join(texts, " "), r.Meta, r.IsError
}

// TestSEP2848Statements checks the seven MCP-observable statements of the
// SEP's Reference Implementation section against real processes.
func TestSEP2848Statements(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{})
	rec := &recorder{}
	alice := s.client(s.alice)
	alice.HTTP = &http.Client{Transport: rec, Timeout: time.Minute}
	ctx := context.Background()
	wire := func(amount float64) map[string]any { return map[string]any{"to": "acct-991", "amount": amount} }

	var approvedTask string
	t.Run("a requestable denial returns a task without executing the tool", func(t *testing.T) {
		r, err := alice.CallTool(ctx, "wire_transfer", wire(50000), nil)
		require.NoError(t, err)
		require.Equal(t, "task", r.ResultType)
		require.Equal(t, tasks.Working, r.Task.Status)
		require.NotEmpty(t, r.Task.StatusMessage)
		require.NotNil(t, r.Task.TTLMs)
		require.Greater(t, *r.Task.TTLMs, int64(24*time.Hour/time.Millisecond), "ttlMs covers the pending deadline plus retention")
		require.Equal(t, 500, r.Task.PollIntervalMs)
		m := meta(r.Raw)
		env := m["io.modelcontextprotocol/authorization"].(map[string]any)
		require.Equal(t, "available", env["remediation"])
		require.Equal(t, "task", env["remediationHints"].([]any)[0].(map[string]any)["type"])
		require.NotEmpty(t, m["io.modelcontextprotocol/model-immediate-response"])
		require.Zero(t, s.ledger(r.Task.TaskID), "the tool did not run")

		// tasks/get repeats the envelope while the task is pending.
		d, raw, err := alice.Get(ctx, r.Task.TaskID)
		require.NoError(t, err)
		require.Equal(t, tasks.Working, d.Status)
		require.Contains(t, meta(raw), "io.modelcontextprotocol/authorization")
		approvedTask = r.Task.TaskID
	})

	t.Run("approval resumes execution at most once", func(t *testing.T) {
		id := s.requestOf(approvedTask)
		require.Equal(t, 200, s.decide(id, "approve"))
		d := s.waitTask(alice, approvedTask)
		require.Equal(t, tasks.Completed, d.Status)
		text, m, isErr := resultText(t, d)
		require.False(t, isErr)
		require.Equal(t, "approved-executed", m["io.modelcontextprotocol/tool-approval-disposition"])
		require.Contains(t, text, "ran once")
		require.Equal(t, 1, s.ledger(approvedTask))
		// Polling again, and a redelivered callback, run nothing more.
		var deliveries struct {
			Deliveries []struct{ ID string } `json:"deliveries"`
		}
		getJSON(t, s.api+"/v1/requests/"+id+"/deliveries", s.pepToken, &deliveries)
		require.NotEmpty(t, deliveries.Deliveries)
		delivery := deliveries.Deliveries[0].ID
		attempts := s.deliveryAnswered(delivery, 0)
		status, _ := postJSON(t, s.api+"/v1/requests/"+id+"/deliveries/"+delivery+"/redeliver", s.pepToken, map[string]any{})
		require.Equal(t, 202, status)
		// The front-end has answered the redelivery: whatever it would do
		// about it, it has decided.
		s.deliveryAnswered(delivery, attempts)
		for range 3 {
			_, _, err := alice.Get(ctx, approvedTask)
			require.NoError(t, err)
		}
		require.Equal(t, 1, s.ledger(approvedTask), "executed exactly once")
	})

	t.Run("a terminal denial is a completed task whose body says the tool did not run", func(t *testing.T) {
		r, err := alice.CallTool(ctx, "wire_transfer", wire(60000), nil)
		require.NoError(t, err)
		require.Equal(t, 200, s.decide(s.requestOf(r.Task.TaskID), "deny"))
		d := s.waitTask(alice, r.Task.TaskID)
		require.Equal(t, tasks.Completed, d.Status, "a denial is completed, not failed")
		text, m, isErr := resultText(t, d)
		require.True(t, isErr)
		require.Equal(t, "denied-not-executed", m["io.modelcontextprotocol/tool-approval-disposition"])
		require.Contains(t, text, "did not run", "the body says it, not only _meta")
		env := m["io.modelcontextprotocol/authorization"].(map[string]any)
		require.Equal(t, "unavailable", env["remediation"], "envelope, body and disposition agree")
		require.Zero(t, s.ledger(r.Task.TaskID))
		_, raw, err := alice.Get(ctx, r.Task.TaskID)
		require.NoError(t, err)
		require.NotContains(t, meta(raw), "io.modelcontextprotocol/authorization", "no pending envelope once terminal")
	})

	t.Run("a changed envelope needs a new approval", func(t *testing.T) {
		a, err := alice.CallTool(ctx, "wire_transfer", wire(70000), nil)
		require.NoError(t, err)
		same, err := alice.CallTool(ctx, "wire_transfer", wire(70000), nil)
		require.NoError(t, err)
		require.Equal(t, a.Task.TaskID, same.Task.TaskID, "the same call while pending is the same task")
		otherArgs, err := alice.CallTool(ctx, "wire_transfer", wire(70001), nil)
		require.NoError(t, err)
		require.NotEqual(t, a.Task.TaskID, otherArgs.Task.TaskID, "other arguments, another approval")
		mallory := s.client(s.mallory)
		mallory.HTTP = alice.HTTP
		otherCaller, err := mallory.CallTool(ctx, "wire_transfer", wire(70000), nil)
		require.NoError(t, err)
		require.NotEqual(t, a.Task.TaskID, otherCaller.Task.TaskID, "another principal, another approval")
		// Approving one runs only that one.
		require.Equal(t, 200, s.decide(s.requestOf(a.Task.TaskID), "approve"))
		require.Equal(t, tasks.Completed, s.waitTask(alice, a.Task.TaskID).Status)
		require.Equal(t, 1, s.ledger(a.Task.TaskID))
		for _, id := range []string{otherArgs.Task.TaskID, otherCaller.Task.TaskID} {
			d, _, err := alice.Get(ctx, id)
			if id == otherCaller.Task.TaskID {
				require.Error(t, err, "alice cannot even see mallory's task")
				d, _, err = mallory.Get(ctx, id)
			}
			require.NoError(t, err)
			require.Equal(t, tasks.Working, d.Status)
			require.Zero(t, s.ledger(id))
		}
	})

	t.Run("a cancelled task cannot later execute", func(t *testing.T) {
		r, err := alice.CallTool(ctx, "wire_transfer", wire(80000), nil)
		require.NoError(t, err)
		backendID := s.requestOf(r.Task.TaskID)
		require.NoError(t, alice.Cancel(ctx, r.Task.TaskID))
		d, _, err := alice.Get(ctx, r.Task.TaskID)
		require.NoError(t, err)
		require.Equal(t, tasks.Cancelled, d.Status)
		// The backend request was cancelled too; a late approval is refused
		// there, and would be ignored here.
		require.Eventually(t, func() bool {
			var st string
			_ = s.pool.QueryRow(ctx, `SELECT status FROM arap.requests WHERE id = $1`, backendID).Scan(&st)
			return st == "cancelled"
		}, 30*time.Second, 50*time.Millisecond)
		require.Equal(t, 409, s.decide(backendID, "approve"))
		require.NoError(t, alice.Cancel(ctx, r.Task.TaskID), "cancelling a terminal task is acknowledged")
		// The cancellation's callback reached the front-end and was answered.
		s.callbacksSettled(r.Task.TaskID)
		d, _, err = alice.Get(ctx, r.Task.TaskID)
		require.NoError(t, err)
		require.Equal(t, tasks.Cancelled, d.Status)
		require.Zero(t, s.ledger(r.Task.TaskID))
	})

	t.Run("submission input flows through MRTR before the task exists", func(t *testing.T) {
		args := map[string]any{"customer_id": "c-42"}
		before := countPending(s)
		r, err := alice.CallTool(ctx, "read_customer_record", args, nil)
		require.NoError(t, err)
		require.Equal(t, "input_required", r.ResultType)
		require.Len(t, r.InputRequests, 1)
		var key string
		for k := range r.InputRequests {
			key = k
		}
		ir := r.InputRequests[key].(map[string]any)
		require.Equal(t, "elicitation/create", ir["method"])
		schema := ir["params"].(map[string]any)["requestedSchema"].(map[string]any)
		require.Contains(t, schema["properties"], "business_justification")
		require.NotEmpty(t, r.RequestState)
		require.Equal(t, before, countPending(s), "nothing is submitted before the input arrives")

		// A too-short answer is refused against the backend's schema: asked again.
		again, err := alice.CallTool(ctx, "read_customer_record", args, map[string]any{"requestState": r.RequestState,
			"inputResponses": map[string]any{key: map[string]any{"action": "accept", "content": map[string]any{"business_justification": "short"}}}})
		require.NoError(t, err)
		require.Equal(t, "input_required", again.ResultType)
		require.Contains(t, string(again.Raw), "The previous answer was not accepted: business_justification: must be at least 10 characters; give a longer business justification.")
		var key2 string
		for k := range again.InputRequests {
			key2 = k
		}
		require.NotEqual(t, key, key2, "keys are never reused")

		// The state is single-use: replaying the first one is refused.
		_, err = alice.CallTool(ctx, "read_customer_record", args, map[string]any{"requestState": r.RequestState,
			"inputResponses": map[string]any{key: map[string]any{"action": "accept", "content": map[string]any{"business_justification": "Renewal review for ACME"}}}})
		require.ErrorContains(t, err, "already used")
		// Other arguments with this state: refused (the binding does not match).
		_, err = alice.CallTool(ctx, "read_customer_record", map[string]any{"customer_id": "c-43"}, map[string]any{"requestState": again.RequestState,
			"inputResponses": map[string]any{key2: map[string]any{"action": "accept", "content": map[string]any{"business_justification": "Renewal review for ACME"}}}})
		require.ErrorContains(t, err, "does not match the original call")
		// Another caller with this state: refused.
		mallory := s.client(s.mallory)
		_, err = mallory.CallTool(ctx, "read_customer_record", args, map[string]any{"requestState": again.RequestState})
		require.ErrorContains(t, err, "does not match the original call")
		// A tampered state: refused.
		_, err = alice.CallTool(ctx, "read_customer_record", args, map[string]any{"requestState": again.RequestState[:len(again.RequestState)-4] + "AAAA"})
		require.ErrorContains(t, err, "not one this server issued")

		// A fresh round with a good answer gives the task.
		r, err = alice.CallTool(ctx, "read_customer_record", args, nil)
		require.NoError(t, err)
		for k := range r.InputRequests {
			key = k
		}
		final, err := alice.CallTool(ctx, "read_customer_record", args, map[string]any{"requestState": r.RequestState,
			"inputResponses": map[string]any{key: map[string]any{"action": "accept", "content": map[string]any{"business_justification": "Renewal review for ACME"}}}})
		require.NoError(t, err)
		require.Equal(t, "task", final.ResultType)
		var ctxJSON []byte
		require.NoError(t, s.pool.QueryRow(ctx, `SELECT context::text FROM arap.requests WHERE id = $1`, s.requestOf(final.Task.TaskID)).Scan(&ctxJSON))
		require.Contains(t, string(ctxJSON), "Renewal review for ACME", "the justification reached the backend")
		require.Equal(t, 200, s.decide(s.requestOf(final.Task.TaskID), "approve"))
		d := s.waitTask(alice, final.Task.TaskID)
		require.Equal(t, tasks.Completed, d.Status)
		require.Equal(t, 1, s.ledger(final.Task.TaskID))
	})

	t.Run("results never expose backend artifacts", func(t *testing.T) {
		rec.scan(t, s.api)
	})
}

func countPending(s *stack) int { return len(s.pendingRequests()) }

func getJSON(t *testing.T, url, token string, out any) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(out))
}
