package chaos

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
)

// retryable says whether a client would send the request again, and why:
// "unavailable" for the answers of a passing outage, which say nothing ran
// (JSON-RPC -31001, HTTP 429 or 503; the checker holds arap to that),
// "internal" for an internal error (-32603, code 0, which is no JSON-RPC
// code, or another 5xx; a client may retry, but an outage should never be
// answered so: the summary counts them), "lost" for no answer at all.
func retryable(err error) (bool, string) {
	var rpc *tasks.RPCError
	if errors.As(err, &rpc) {
		switch {
		case rpc.Code == tasks.CodeUnavailable || rpc.HTTPStatus == http.StatusTooManyRequests || rpc.HTTPStatus == http.StatusServiceUnavailable:
			return true, "unavailable"
		case rpc.Code == tasks.CodeInternalError || rpc.Code == 0 || rpc.HTTPStatus >= 500:
			return true, "internal"
		}
		return false, "error"
	}
	return true, "lost"
}

type caller struct {
	i       int
	token   string
	clients []*tasks.Client
	rng     *rand.Rand
	record  func(*Call)
	stopNew <-chan struct{}
}

func (c *caller) client() *tasks.Client { return c.clients[c.rng.IntN(len(c.clients))] }

func (c *caller) callID() string {
	b := make([]byte, 6)
	for i := range b {
		b[i] = byte(c.rng.Uint32())
	}
	return fmt.Sprintf("c%02d-%s", c.i, hex.EncodeToString(b))
}

// run makes calls until stopNew closes, then returns; the last call is
// followed to its end (the settle phase keeps polling).
func (c *caller) run(ctx context.Context, settled <-chan struct{}) {
	for {
		select {
		case <-c.stopNew:
			return
		case <-ctx.Done():
			return
		default:
		}
		call := c.oneCall(ctx, settled)
		c.record(call)
		time.Sleep(time.Duration(50+c.rng.IntN(250)) * time.Millisecond)
	}
}

func (c *caller) oneCall(ctx context.Context, settled <-chan struct{}) *Call {
	id := c.callID()
	call := &Call{ID: id, Caller: c.i, Start: time.Now()}
	var args map[string]any
	switch x := c.rng.IntN(100); {
	case x < 15:
		call.Tool, call.Kind, args = upstreamPfx+ToolNote, "allowed", map[string]any{"call_id": id}
	case x < 19:
		call.Tool, call.Kind, args = "get_balance", "allowed", map[string]any{}
	case x < 22:
		// Allowed without approval (up to 25,000): a direct run whose side
		// effect (a pep.ledger row without a task) the checker counts.
		call.Tool, call.Kind, args = "wire_transfer", "allowed", map[string]any{"to": "acct-" + id, "amount": 100 + c.rng.IntN(1000)}
	case x < 30:
		call.Tool, call.Kind, args = upstreamPfx+ToolForbidden, "denied", map[string]any{"call_id": id}
	case x < 62:
		call.Tool, call.Kind, args = upstreamPfx+ToolPay, "gated", map[string]any{"call_id": id, "amount": 100 + c.rng.IntN(1000)}
	case x < 72:
		// Needs a business justification (MRTR input) before it is submitted.
		call.Tool, call.Kind, args = "read_customer_record", "gated", map[string]any{"customer_id": "cust-" + id}
	default:
		call.Tool, call.Kind, args = "wire_transfer", "gated", map[string]any{"to": "acct-" + id, "amount": 30000 + c.rng.IntN(1000)}
	}
	// Send (and resend the same request after a lost response) until an
	// answer comes: a task, a result or a final error. An input request
	// (MRTR) is answered; if the answer's single-use state is refused after
	// a lost response, the call starts over.
	var prev *tasks.CallResult
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 15*time.Second)
		var r *tasks.CallResult
		var err error
		a := Attempt{Method: "tools/call"}
		if prev != nil {
			a.Method = "tools/call+input"
			r, err = c.client().Retry(actx, call.Tool, args, prev, justification(prev.InputRequests, id))
		} else {
			r, err = c.client().CallTool(actx, call.Tool, args, nil)
		}
		cancel()
		a.At = time.Now()
		if err != nil {
			retry, kind := retryable(err)
			a.Outcome, a.Detail = kind, trim(err.Error())
			call.Attempts = append(call.Attempts, a)
			if !retry && prev != nil && attempt < 20 {
				prev = nil // the state was used by the lost attempt: start over
				continue
			}
			if retry && attempt < 20 && ctx.Err() == nil && !isClosed(settled) {
				time.Sleep(time.Duration(200+c.rng.IntN(800)) * time.Millisecond)
				continue
			}
			call.Final = a.Outcome
			call.End = time.Now()
			return call
		}
		if r.ResultType == tasks.ResultTypeInputRequired && attempt < 20 {
			a.Outcome = "input_required"
			call.Attempts = append(call.Attempts, a)
			prev = r
			continue
		}
		if r.ResultType == tasks.ResultTypeTask && r.Task != nil {
			a.Outcome, a.Detail = "task", r.Task.TaskID
			call.Attempts = append(call.Attempts, a)
			call.TaskID = r.Task.TaskID
			break
		}
		a.Outcome = "result"
		if r.IsError {
			a.Outcome, a.Detail = "error-result", resultText(r.Raw)
		}
		call.Attempts = append(call.Attempts, a)
		call.Final = a.Outcome
		call.End = time.Now()
		return call
	}
	c.follow(ctx, call, settled)
	call.End = time.Now()
	return call
}

// follow polls tasks/get until the task ends, sometimes cancelling it
// first; after the settle deadline it gives up (the checker then reads the
// tables).
func (c *caller) follow(ctx context.Context, call *Call, settled <-chan struct{}) {
	cancelAt := time.Time{}
	if c.rng.IntN(100) < 10 {
		cancelAt = time.Now().Add(time.Duration(c.rng.IntN(5000)) * time.Millisecond)
	}
	for {
		if !cancelAt.IsZero() && time.Now().After(cancelAt) {
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := c.client().Cancel(actx, call.TaskID)
			cancel()
			a := Attempt{At: time.Now(), Method: "tasks/cancel", Outcome: "ok"}
			if err != nil {
				retry, kind := retryable(err)
				a.Outcome, a.Detail = kind, trim(err.Error())
				if !retry {
					cancelAt = time.Time{} // refused (already ended): stop asking
				}
			} else {
				call.Cancelled, cancelAt = true, time.Time{}
			}
			call.Attempts = append(call.Attempts, a)
		}
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		d, raw, err := c.client().Get(actx, call.TaskID)
		cancel()
		if err != nil {
			_, kind := retryable(err)
			call.Attempts = append(call.Attempts, Attempt{At: time.Now(), Method: "tasks/get", Outcome: kind, Detail: trim(err.Error())})
		} else if d.Status.Terminal() {
			call.Attempts = append(call.Attempts, Attempt{At: time.Now(), Method: "tasks/get", Outcome: string(d.Status)})
			call.Final = string(d.Status)
			call.Disp = disposition(raw)
			return
		} else if d.Status == tasks.InputRequired && len(d.InputRequests) > 0 {
			// The task asks for input again (a new approval after a
			// revocation needs a new justification): answer, as the
			// client that made the call would.
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := c.client().Update(actx, call.TaskID, justification(d.InputRequests, call.ID))
			cancel()
			a := Attempt{At: time.Now(), Method: "tasks/update", Outcome: "ok"}
			if err != nil {
				_, a.Outcome = retryable(err)
				a.Detail = trim(err.Error())
			}
			call.Attempts = append(call.Attempts, a)
		}
		select {
		case <-ctx.Done():
			return
		case <-settled:
			return
		case <-time.After(time.Duration(500+c.rng.IntN(1000)) * time.Millisecond):
		}
	}
}

// resultText is the text of a tool result's content, trimmed.
func resultText(raw []byte) string {
	var r struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	}
	if jsonUnmarshal(raw, &r) != nil || len(r.Content) == 0 {
		return trim(string(raw))
	}
	return trim(r.Content[0].Text)
}

// justification answers each of a call's input requests with a business
// justification naming the call.
func justification[V any](requests map[string]V, callID string) map[string]any {
	responses := map[string]any{}
	for k := range requests {
		responses[k] = map[string]any{"action": "accept", "content": map[string]any{"business_justification": "Chaos run review of " + callID}}
	}
	return responses
}

// disposition finds the tool-approval disposition anywhere in a terminal
// task's tasks/get answer (the result's or the error's _meta).
func disposition(raw []byte) string {
	var v any
	if jsonUnmarshal(raw, &v) != nil {
		return ""
	}
	var find func(any) string
	find = func(v any) string {
		switch x := v.(type) {
		case map[string]any:
			if d, ok := x[pep.MetaDisposition].(string); ok {
				return d
			}
			for _, e := range x {
				if d := find(e); d != "" {
					return d
				}
			}
		case []any:
			for _, e := range x {
				if d := find(e); d != "" {
					return d
				}
			}
		}
		return ""
	}
	return find(v)
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func trim(s string) string {
	if len(s) > 160 {
		return s[:160]
	}
	return s
}

// approver decides pending backend requests at random through the decision
// API, as an ITSM system would: approve, deny, leave to expire, or approve
// and then revoke the approval.
type approver struct {
	s        *system
	rng      *rand.Rand
	mu       sync.Mutex
	planned  map[string]string // request -> action
	events   *eventLog
	http     *http.Client
	revokeAt map[string]time.Time
}

func (a *approver) run(ctx context.Context, stop <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-stop:
			return
		case <-time.After(300 * time.Millisecond):
		}
		a.round(ctx)
	}
}

func (a *approver) round(ctx context.Context) {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	rows, err := a.s.db.Query(qctx, `SELECT r.id, r.status, COALESCE(a.status, '') FROM arap.requests r
		LEFT JOIN arap.approvals a ON a.request_id = r.id
		WHERE r.status = 'pending' OR (r.status = 'approved' AND a.status = 'active') ORDER BY r.created_at LIMIT 200`)
	if err != nil {
		cancel()
		return
	}
	type req struct{ id, status, approval string }
	var reqs []req
	for rows.Next() {
		var r req
		if rows.Scan(&r.id, &r.status, &r.approval) == nil {
			reqs = append(reqs, r)
		}
	}
	rows.Close()
	cancel()
	for _, r := range reqs {
		plan, ok := a.planned[r.id]
		if !ok {
			switch x := a.rng.IntN(100); {
			case x < 55:
				plan = "approve"
			case x < 75:
				plan = "deny"
			case x < 87:
				plan = "expire"
			default:
				plan = "revoke"
			}
			a.planned[r.id] = plan
			a.revokeAt[r.id] = time.Now().Add(time.Duration(a.rng.IntN(3000)) * time.Millisecond)
		}
		switch {
		case r.status == "pending" && plan != "expire":
			decision := "approve"
			if plan == "deny" {
				decision = "deny"
			}
			if a.rng.IntN(100) < 50 {
				continue // decide later: a human is not instant
			}
			a.post(ctx, r.id, decision, "/v1/requests/"+r.id+"/decisions", fmt.Sprintf(`{"decision":%q,"reason":"chaos"}`, decision))
		case r.status == "approved" && plan == "revoke" && time.Now().After(a.revokeAt[r.id]):
			a.post(ctx, r.id, "revoke", "/v1/approvals/"+r.id+"/revoke", `{"reason":"chaos"}`)
			a.planned[r.id] = "revoked"
		}
	}
}

func (a *approver) post(ctx context.Context, id, action, path, body string) {
	base := a.s.backends[a.rng.IntN(len(a.s.backends))]
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(rctx, http.MethodPost, base+path, bytes.NewReader([]byte(body)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+a.s.creds.ITSMToken)
	d := Decision{Request: id, Action: action}
	resp, err := a.http.Do(req)
	if err == nil {
		d.Status = resp.StatusCode
		resp.Body.Close()
	}
	d.At = time.Now()
	a.events.decision(d)
}
