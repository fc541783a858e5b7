package sep2848

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fake is a small MCP server with a built-in approval backend, enough for
// the expiry scenario: a gated call opens a task that waits for an
// approval, and expires, denied, when it is read past its deadline;
// get_balance is the probe. It is also its own Resolver. lateApproval says
// what it does with an approval given after a task ended: "refuse" (a
// backend that refuses it, as arapd's does), "ignore" (a backend that
// takes it and a server that fences the task, so nothing happens), "run"
// (a server that runs the tool on it) or "reopen" (one that completes the
// ended task anew).
type fake struct {
	lateApproval string
	expireAfter  time.Duration

	mu      sync.Mutex
	balance float64
	tasks   map[string]*fakeTask
	n       int
}

type fakeTask struct {
	id      string
	call    Call
	created time.Time
	status  string
	result  map[string]any
}

func (f *fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		ID     any            `json:"id"`
		Method string         `json:"method"`
		Params map[string]any `json:"params"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	result, rpcErr := f.handle(req.Method, req.Params)
	f.mu.Unlock()
	resp := map[string]any{"jsonrpc": "2.0", "id": req.ID}
	if rpcErr != nil {
		resp["error"] = rpcErr
	} else {
		resp["result"] = result
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

func (f *fake) handle(method string, params map[string]any) (any, *rpcError) {
	switch method {
	case MethodCall:
		name, _ := params["name"].(string)
		if name == "get_balance" {
			return map[string]any{"content": []any{}, "structuredContent": map[string]any{"balance": f.balance}}, nil
		}
		args, _ := params["arguments"].(map[string]any)
		f.n++
		t := &fakeTask{id: fmt.Sprintf("tsk_%d_7MZQ2XKD4TJW6N3HBV5RGC8YPA", f.n), call: Call{Name: name, Arguments: args},
			created: time.Now(), status: StatusWorking}
		f.tasks[t.id] = t
		out := f.wire(t)
		out["resultType"] = ResultTask
		return out, nil
	case MethodGet:
		id, _ := params["taskId"].(string)
		t, ok := f.tasks[id]
		if !ok {
			return nil, &rpcError{Code: -32602, Message: "task not found"}
		}
		if t.status == StatusWorking && time.Since(t.created) > f.expireAfter {
			t.status = StatusCompleted
			t.result = map[string]any{"isError": true,
				"content": []any{map[string]any{"type": "text", "text": "The approval request expired without a decision; the tool did not run."}},
				"_meta": map[string]any{MetaDisposition: DeniedNotExecuted,
					MetaAuthorization: map[string]any{"reason": ReasonInsufficientAuthorization, "remediation": RemediationUnavailable}}}
		}
		out := f.wire(t)
		out["resultType"] = ResultComplete
		return out, nil
	}
	return nil, &rpcError{Code: codeMethodNotFound, Message: "method not found: " + method}
}

func (f *fake) wire(t *fakeTask) map[string]any {
	out := map[string]any{"taskId": t.id, "status": t.status, "statusMessage": "Waiting for approval.", "ttlMs": nil, "pollIntervalMs": 50,
		"createdAt": t.created.Format(time.RFC3339Nano), "lastUpdatedAt": time.Now().Format(time.RFC3339Nano)}
	if t.status == StatusWorking {
		out["_meta"] = map[string]any{MetaAuthorization: map[string]any{"reason": ReasonInsufficientAuthorization, "remediation": RemediationAvailable,
			"remediationHints": []any{map[string]any{"type": "task"}}}}
	} else {
		out["statusMessage"] = "Ended."
		out["result"] = t.result
	}
	return out
}

// Resolve is the fake's backend deciding: an approval of a waiting task
// runs it; one of an ended task is handled as lateApproval says.
func (f *fake) Resolve(_ context.Context, taskID string, _ Call, approve bool, _ string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.tasks[taskID]
	if !ok {
		return errors.New("no such request")
	}
	if t.status == StatusWorking || !approve {
		return errors.New("the fake decides only late approvals")
	}
	switch f.lateApproval {
	case "refuse":
		return errors.New("409: the request has ended")
	case "run":
		f.balance -= 50000
	case "reopen":
		f.balance -= 50000
		t.result = map[string]any{"content": []any{map[string]any{"type": "text", "text": "Approved; the tool ran."}},
			"_meta": map[string]any{MetaDisposition: ApprovedExecuted}}
	}
	return nil
}

// TestLateApprovalAfterExpiry: sep-2848-expired-fenced fails a server that
// acts on an approval given after its request expired, whether it runs the
// tool or completes the task anew, and passes one that fences the task,
// whether its backend refuses the late approval or takes it. (Against
// arapd the backend refuses it, so only this fake shows the check seeing a
// server's own fence fail.)
func TestLateApprovalAfterExpiry(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ late, fails string }{
		{"refuse", ""},
		{"ignore", ""},
		{"run", "the tool ran after the request expired"},
		{"reopen", "changed the task"},
	} {
		t.Run(c.late, func(t *testing.T) {
			t.Parallel()
			f := &fake{lateApproval: c.late, expireAfter: 300 * time.Millisecond, balance: 1e6, tasks: map[string]*fakeTask{}}
			srv := httptest.NewServer(f)
			defer srv.Close()
			gated := Call{Name: "wire_transfer", Arguments: map[string]any{"to": "conf-{nonce}", "amount": 50000}}
			expiring := gated
			results := Run(context.Background(), Config{URL: srv.URL, Token: "t", Resolver: f, Scenarios: []string{"expiry"}, Timeout: 30 * time.Second,
				Profile: Profile{Gated: gated, Changed: gated, Expiring: &expiring, ExpiresWithin: Duration(time.Second),
					Probe: &Probe{Call: Call{Name: "get_balance", Arguments: map[string]any{}}, Field: "balance", PerExecution: -50000}}})
			got := map[string]Result{}
			for _, r := range results {
				got[r.ID] = r
			}
			require.Len(t, got, 2)
			require.Equal(t, Passed, got["sep-2848-expired-denied"].Outcome, "%+v", got["sep-2848-expired-denied"])
			fenced := got["sep-2848-expired-fenced"]
			if c.fails == "" {
				require.Equal(t, Passed, fenced.Outcome, "%+v", fenced)
				return
			}
			require.Equal(t, Failed, fenced.Outcome)
			require.Contains(t, fenced.Detail, c.fails)
		})
	}
}
