package arapclient_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dev"
)

// transfer is alice's wire_transfer of amount, as a PEP asks about it.
func transfer(amount int) authzen.EvaluationRequest {
	return authzen.EvaluationRequest{
		Subject:  authzen.Object{"type": "user", "id": "alice"},
		Action:   authzen.Object{"name": "tools/call"},
		Resource: authzen.Object{"type": "mcp_tool", "id": "wire_transfer", "properties": map[string]any{"arguments": map[string]any{"to": "acct-991", "amount": amount}}},
	}
}

func setup(t *testing.T) (*backendtest.Env, *arapclient.Client, *arapclient.Client) {
	t.Helper()
	env := backendtest.Start(t, backendtest.Options{})
	return env, &arapclient.Client{BaseURL: env.URL, Token: dev.PEPToken}, &arapclient.Client{BaseURL: env.URL, Token: dev.ITSMToken}
}

// TestSubmitFromRequestableDenial: the typed path from a requestable denial
// to a task: Requestable carries the binding, Submit sends exactly the
// denied call bound to it, a repeated key returns the same task, Status and
// Cancel act on it; an allow offers nothing to request.
func TestSubmitFromRequestableDenial(t *testing.T) {
	t.Parallel()
	_, pep, _ := setup(t)
	ctx := context.Background()

	d, err := pep.Evaluate(ctx, transfer(100))
	require.NoError(t, err)
	require.True(t, d.Decision)
	_, ok := arapclient.Requestable(transfer(100), d)
	require.False(t, ok, "an allow offers no access request")

	call := transfer(50000)
	d, err = pep.Evaluate(ctx, call)
	require.NoError(t, err)
	require.False(t, d.Decision)
	ar, ok := arapclient.Requestable(call, d)
	require.True(t, ok)
	require.NotEmpty(t, ar.BindingToken)
	require.NotEmpty(t, ar.EvaluationID)
	require.Equal(t, "treasury_approval", ar.Template)
	require.Equal(t, "Treasury approval", ar.Display["title"])
	require.True(t, ar.ExpiresAt.After(time.Now()))

	tr, err := pep.Submit(ctx, ar, arapclient.SubmitOptions{IdempotencyKey: "key-" + t.Name()})
	require.NoError(t, err)
	require.Equal(t, authzen.StatusPending, tr.Task.Status)
	again, err := pep.Submit(ctx, ar, arapclient.SubmitOptions{IdempotencyKey: "key-" + t.Name()})
	require.NoError(t, err)
	require.Equal(t, tr.Task.ID, again.Task.ID, "a repeated key returns the same task")

	st, retry, err := pep.Status(ctx, tr.Task.StatusEndpoint)
	require.NoError(t, err)
	require.Equal(t, authzen.StatusPending, st.Task.Status)
	require.Equal(t, 5*time.Second, retry)

	cancelURL, _ := st.Task.Links["cancel"].(string)
	done, err := pep.Cancel(ctx, cancelURL, "no_longer_needed")
	require.NoError(t, err)
	require.Equal(t, authzen.StatusCancelled, done.Task.Status)

	// The denial's offer is bound to the call: another amount is refused.
	other := *ar
	other.Call = transfer(60000)
	_, err = pep.Submit(ctx, &other, arapclient.SubmitOptions{})
	require.True(t, arapclient.IsProblem(err, authzen.ProblemInvalidDenialBinding), "%v", err)

	// An offer that has ended is not sent.
	expired := *ar
	expired.ExpiresAt = time.Now().Add(-time.Second)
	_, err = pep.Submit(ctx, &expired, arapclient.SubmitOptions{})
	require.ErrorIs(t, err, arapclient.ErrDenialExpired)
}

// TestSubmitAddsWhatTheSchemaAsks: a rule with a request schema names it in
// RequestSchemaURL; Submit adds the context it asks for, and without it the
// service refuses with schema_violation, decoded into a ProblemError.
func TestSubmitAddsWhatTheSchemaAsks(t *testing.T) {
	t.Parallel()
	_, pep, _ := setup(t)
	ctx := context.Background()
	call := authzen.EvaluationRequest{
		Subject:  authzen.Object{"type": "user", "id": "alice"},
		Action:   authzen.Object{"name": "tools/call"},
		Resource: authzen.Object{"type": "mcp_tool", "id": "read_customer_record", "properties": map[string]any{"arguments": map[string]any{"customer_id": "c-1"}}},
	}
	d, err := pep.Evaluate(ctx, call)
	require.NoError(t, err)
	ar, ok := arapclient.Requestable(call, d)
	require.True(t, ok)
	require.NotEmpty(t, ar.RequestSchemaURL)
	schema, err := pep.Schema(ctx, ar.RequestSchemaURL)
	require.NoError(t, err)
	require.Contains(t, schema, "properties")

	_, err = pep.Submit(ctx, ar, arapclient.SubmitOptions{})
	var pe *arapclient.ProblemError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, authzen.LocalProblemPrefix+authzen.ProblemSchemaViolation, pe.Problem.Type)
	require.Equal(t, http.StatusBadRequest, pe.Status)

	tr, err := pep.Submit(ctx, ar, arapclient.SubmitOptions{Context: authzen.Object{"business_justification": "Renewal call with the customer tomorrow"}})
	require.NoError(t, err)
	require.Equal(t, authzen.StatusPending, tr.Task.Status)
}

// TestProblemErrors: refusals are typed: the problem type, its code and the
// HTTP status.
func TestProblemErrors(t *testing.T) {
	t.Parallel()
	env, pep, _ := setup(t)
	_, _, err := pep.Status(context.Background(), env.URL+authzen.PathRequests+"/arq_01JAAAAAAAAAAAAAAAAAAAAAAA")
	var pe *arapclient.ProblemError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, authzen.ProblemPrefix+authzen.ProblemUnknownTask, pe.Problem.Type)
	require.Equal(t, authzen.ProblemUnknownTask, pe.Code())
	require.True(t, arapclient.IsProblem(err, authzen.ProblemUnknownTask))

	bad := &arapclient.Client{BaseURL: env.URL, Token: "wrong"}
	_, err = bad.Evaluate(context.Background(), transfer(1))
	require.ErrorAs(t, err, &pe)
	require.Equal(t, http.StatusUnauthorized, pe.Status)

	// A URL the service did not hand out on its own origin is refused
	// before the token leaves.
	_, _, err = pep.Status(context.Background(), "http://198.51.100.1/access/v1/requests/arq_1")
	require.ErrorContains(t, err, "refusing URL")
}

// TestWaitWokenByCallbackThenReevaluate: a submission with a callback to a
// Callbacks handler; Wait's pauses never end by themselves, so only the
// verified callback can end it; the approved status carries the approval,
// and Reevaluate with it is the allow.
func TestWaitWokenByCallbackThenReevaluate(t *testing.T) {
	t.Parallel()
	_, pep, itsm := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cbs, err := arapclient.NewCallbacks(dev.PEPWebhookSecret)
	require.NoError(t, err)
	srv := httptest.NewServer(cbs)
	t.Cleanup(srv.Close)

	call := transfer(50000)
	d, err := pep.Evaluate(ctx, call)
	require.NoError(t, err)
	ar, ok := arapclient.Requestable(call, d)
	require.True(t, ok)
	tr, err := pep.Submit(ctx, ar, arapclient.SubmitOptions{Callback: &authzen.Callback{Endpoint: srv.URL + "/arap", State: "s1"}})
	require.NoError(t, err)

	// The wait's pauses never end by themselves: only a callback ends one.
	// The decision comes once the wait has read the pending status.
	paused := make(chan struct{}, 10)
	opts := arapclient.WithTimer(arapclient.WaitOptions{Callbacks: cbs}, func(time.Duration) <-chan time.Time {
		paused <- struct{}{}
		return nil
	})
	waited := make(chan authzen.TaskResponse, 1)
	errs := make(chan error, 1)
	go func() {
		got, err := pep.Wait(ctx, tr.Task, opts)
		errs <- err
		waited <- got
	}()
	<-paused
	_, err = itsm.Decide(ctx, tr.Task.ID, arapclient.Decision{Decision: arapclient.DecisionApprove, Reason: "CHG-7"})
	require.NoError(t, err)
	require.NoError(t, <-errs, "woken by the callback before the deadline")
	got := <-waited
	require.Equal(t, authzen.StatusApproved, got.Task.Status)

	allow, err := pep.Reevaluate(ctx, call, got)
	require.NoError(t, err)
	require.True(t, allow.Decision, "%+v", allow)

	// The approval is for this call only.
	other, err := pep.Reevaluate(ctx, transfer(50001), got)
	require.NoError(t, err)
	require.False(t, other.Decision)

	// A task without an approval is not presented.
	_, err = pep.Reevaluate(ctx, call, tr)
	require.ErrorIs(t, err, arapclient.ErrNoApproval)
}

// TestWaitEndsWithContext: a wait on a pending task ends when its context
// does.
func TestWaitEndsWithContext(t *testing.T) {
	t.Parallel()
	_, pep, _ := setup(t)
	call := transfer(50000)
	d, err := pep.Evaluate(context.Background(), call)
	require.NoError(t, err)
	ar, _ := arapclient.Requestable(call, d)
	tr, err := pep.Submit(context.Background(), ar, arapclient.SubmitOptions{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = pep.Wait(ctx, tr.Task, arapclient.WaitOptions{})
	require.ErrorIs(t, err, context.Canceled)
}

// TestDecisionAPIKeepsEveryMember: the decision API's typed view reads back
// every member the backend sends, so arapctl's exact JSON loses nothing.
func TestDecisionAPIKeepsEveryMember(t *testing.T) {
	t.Parallel()
	env, pep, itsm := setup(t)
	ctx := context.Background()
	id := env.Submit(t, map[string]any{
		"subject":  map[string]any{"type": "user", "id": "alice"},
		"action":   map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": "read_customer_record", "properties": map[string]any{"arguments": map[string]any{"customer_id": "c-\u202e1"}}},
		"context":  map[string]any{"business_justification": "Renewal call with the customer"},
		"client":   map[string]any{"id": "c1", "name": "demo"},
	})
	list, err := itsm.Requests(ctx, arapclient.ListOptions{Status: authzen.StatusPending})
	require.NoError(t, err)
	require.Len(t, list.Requests, 1)
	require.Equal(t, id, list.Requests[0].ID)
	require.True(t, list.Requests[0].YouMayDecide)

	v, err := itsm.Decide(ctx, id, arapclient.Decision{Decision: arapclient.DecisionApprove, Reason: "ok"})
	require.NoError(t, err)
	require.Equal(t, authzen.StatusApproved, v.Status)
	require.NotNil(t, v.Approval)

	req, _ := http.NewRequest(http.MethodGet, env.URL+"/v1/requests/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+dev.ITSMToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var typed arapclient.RequestView
	require.NoError(t, json.Unmarshal(raw, &typed))
	back, err := json.Marshal(typed)
	require.NoError(t, err)
	require.JSONEq(t, string(raw), string(back))
	require.NotEmpty(t, typed.Votes)
	require.NotEmpty(t, typed.HiddenCharacters)

	revoked, err := itsm.Revoke(ctx, v.Approval.ID, "changed my mind")
	require.True(t, err == nil || arapclient.IsProblem(err, authzen.ProblemInsufficientScope), "%v", err)
	_ = revoked
	_, err = pep.Deliveries(ctx, id)
	require.NoError(t, err)
}
