package sep2848

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"
)

// Resolver decides, out of band, the approval behind a task: the adapter a
// server under test provides so scenarios can approve and deny. It is given
// the call as well as the task id, since a backend usually knows the call
// and not the MCP task. It decides the call's current approval request;
// when there is none to decide (it ended), it returns an error.
type Resolver interface {
	Resolve(ctx context.Context, taskID string, call Call, approve bool, reason string) error
}

// Deciders is implemented by a Resolver that knows who decided: strings
// identifying the approver, which must never reach the client.
type Deciders interface {
	Deciders() []string
}

// Canceller is implemented by a Resolver that can cancel a call's pending
// approval request at the backend (as an operator, or the requester through
// another channel, would).
type Canceller interface {
	CancelRequest(ctx context.Context, taskID string, call Call) error
}

// RequestReader is implemented by a Resolver whose backend supports
// cancellation and that can read the status of a call's latest approval
// request ("pending", "cancelled", ...): its pending one, or else one that
// ended. The cancel scenario then requires
// a winning tasks/cancel to cancel that request at the backend.
type RequestReader interface {
	RequestStatus(ctx context.Context, taskID string, call Call) (string, error)
}

// DecisionAPI resolves through the arap backend's decision API: it finds the
// pending request for the call (tool and arguments) and posts a decision
// as a decider client (scope decide). With CancelToken (a client holding
// scope request, the one that submitted) it also cancels requests at the
// backend.
type DecisionAPI struct {
	URL, Token  string
	CancelToken string
	HTTP        *http.Client

	mu       sync.Mutex
	deciders []string
}

// Deciders lists the voters the backend recorded for this adapter's
// decisions (for example client:itsm) and their names.
func (d *DecisionAPI) Deciders() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.deciders)
}

func (d *DecisionAPI) learn(body []byte) {
	var view struct {
		Votes []struct {
			Voter string `json:"voter"`
		} `json:"votes"`
	}
	if json.Unmarshal(body, &view) != nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, v := range view.Votes {
		for _, s := range []string{v.Voter, v.Voter[strings.Index(v.Voter, ":")+1:]} {
			if s != "" && !slices.Contains(d.deciders, s) {
				d.deciders = append(d.deciders, s)
			}
		}
	}
}

// CancelRequest cancels the call's pending request through the Access
// Request Service's cancellation endpoint.
func (d *DecisionAPI) CancelRequest(ctx context.Context, _ string, call Call) error {
	if d.CancelToken == "" {
		return errors.New("decision API: no cancel token")
	}
	id, err := d.find(ctx, call)
	if err != nil {
		return err
	}
	status, _, err := d.do(ctx, http.MethodPost, "/access/v1/requests/"+url.PathEscape(id)+"/cancel", d.CancelToken, []byte(`{"reason":"conformance"}`))
	if err != nil {
		return err
	}
	if status/100 != 2 {
		return fmt.Errorf("decision API: cancel request %s: HTTP %d", id, status)
	}
	return nil
}

func (d *DecisionAPI) Resolve(ctx context.Context, _ string, call Call, approve bool, reason string) error {
	id, err := d.find(ctx, call)
	if err != nil {
		return err
	}
	decision := "deny"
	if approve {
		decision = "approve"
	}
	body, _ := json.Marshal(map[string]any{"decision": decision, "reason": reason})
	status, resp, err := d.do(ctx, http.MethodPost, "/v1/requests/"+url.PathEscape(id)+"/decisions", d.Token, body)
	if err != nil {
		return err
	}
	if status/100 != 2 {
		return fmt.Errorf("decision API: %s on request %s: HTTP %d", decision, id, status)
	}
	d.learn(resp)
	return nil
}

// RequestStatus reads the status of the call's request (its pending one,
// or else one that ended).
func (d *DecisionAPI) RequestStatus(ctx context.Context, _ string, call Call) (string, error) {
	for _, status := range []string{"pending", ""} {
		id, st, err := d.scanStatus(ctx, call, status)
		if id != "" || err != nil {
			return st, err
		}
	}
	return "", fmt.Errorf("decision API: no request for %s %v", call.Name, call.Arguments)
}

// find waits (briefly) for the request whose resource is the call: a
// pending one, or else one that has ended (a late decision on it must be
// refused by the backend and change nothing at the server).
func (d *DecisionAPI) find(ctx context.Context, call Call) (string, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, status := range []string{"pending", ""} {
			id, err := d.scan(ctx, call, status)
			if id != "" || err != nil {
				return id, err
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("decision API: no request for %s %v", call.Name, call.Arguments)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// scan looks through up to ten pages of requests in a status ("" for all).
func (d *DecisionAPI) scan(ctx context.Context, call Call, status string) (string, error) {
	id, _, err := d.scanStatus(ctx, call, status)
	return id, err
}

// scanStatus is scan, returning the request's status too.
func (d *DecisionAPI) scanStatus(ctx context.Context, call Call, status string) (string, string, error) {
	want := normalize(call.Arguments)
	cursor := ""
	for range 10 {
		code, body, err := d.do(ctx, http.MethodGet, "/v1/requests?limit=100&status="+status+"&cursor="+url.QueryEscape(cursor), d.Token, nil)
		if err != nil {
			return "", "", err
		}
		var page struct {
			Requests []struct {
				ID       string `json:"id"`
				Status   string `json:"status"`
				Resource struct {
					ID         string `json:"id"`
					Properties struct {
						Arguments any `json:"arguments"`
					} `json:"properties"`
				} `json:"resource"`
			} `json:"requests"`
			NextCursor string `json:"next_cursor"`
		}
		err = json.Unmarshal(body, &page)
		if code != http.StatusOK || err != nil {
			return "", "", fmt.Errorf("decision API: list requests: HTTP %d %v", code, err)
		}
		for _, r := range page.Requests {
			if r.Resource.ID == call.Name && reflect.DeepEqual(normalize(r.Resource.Properties.Arguments), want) {
				return r.ID, r.Status, nil
			}
		}
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	return "", "", nil
}

// do sends one request with token and returns the status and the body
// (at most 8 MiB).
func (d *DecisionAPI) do(ctx context.Context, method, path, token string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(d.URL, "/")+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	hc := d.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("decision API: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return 0, nil, fmt.Errorf("decision API: %s %s: read: %w", method, path, err)
	}
	return resp.StatusCode, out, nil
}

// normalize makes numbers and maps comparable after a JSON round trip.
func normalize(v any) any {
	b, _ := json.Marshal(v)
	var out any
	_ = json.Unmarshal(b, &out)
	return out
}

// Command resolves by running a shell command with the decision in its
// environment: SEP2848_TASK_ID, SEP2848_DECISION (approve or deny),
// SEP2848_TOOL, SEP2848_ARGUMENTS (JSON) and SEP2848_REASON. Exit status 0
// means decided. Any server can provide one.
type Command struct{ Line string }

func (c *Command) Resolve(ctx context.Context, taskID string, call Call, approve bool, reason string) error {
	decision := "deny"
	if approve {
		decision = "approve"
	}
	args, _ := json.Marshal(call.Arguments)
	cmd := exec.CommandContext(ctx, "sh", "-c", c.Line)
	cmd.Env = append(os.Environ(), "SEP2848_TASK_ID="+taskID, "SEP2848_DECISION="+decision,
		"SEP2848_TOOL="+call.Name, "SEP2848_ARGUMENTS="+string(args), "SEP2848_REASON="+reason)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("resolve command: %w: %.300s", err, out)
	}
	return nil
}
