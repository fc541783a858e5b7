package callbacks_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/callbacks"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/webhook"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// receiver is a real HTTP server on loopback that answers with the scripted
// statuses in turn (200 once the script runs out) and records what it got.
type receiver struct {
	*httptest.Server
	mu      sync.Mutex
	script  []int
	headers map[int]http.Header
	got     []*http.Request
	bodies  [][]byte
	at      []time.Time
}

func newReceiver(t *testing.T, script ...int) *receiver {
	rc := &receiver{script: script}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		rc.got = append(rc.got, r)
		rc.bodies = append(rc.bodies, body)
		rc.at = append(rc.at, time.Now())
		code := http.StatusOK
		if len(rc.script) > 0 {
			code, rc.script = rc.script[0], rc.script[1:]
		}
		if code == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "2")
		}
		rc.mu.Unlock()
		w.WriteHeader(code)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) count() int { rc.mu.Lock(); defer rc.mu.Unlock(); return len(rc.got) }

func do(t *testing.T, base, token, method, path string, body any, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, base+path, rd)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil {
		require.NoError(t, json.Unmarshal(raw, out), "%s", raw)
	}
	return resp.StatusCode
}

// submit creates a wire_transfer request with the given callback; it returns
// the status and the body.
func submit(t *testing.T, env *backendtest.Env, token string, callback any) (int, map[string]any) {
	t.Helper()
	call := map[string]any{
		"subject":  map[string]any{"type": "user", "id": "alice"},
		"action":   map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": "wire_transfer", "properties": map[string]any{"arguments": map[string]any{"to": "acct-991", "amount": 50000, "n": time.Now().UnixNano()}}},
	}
	var d authzen.Decision
	require.Equal(t, 200, do(t, env.URL, token, "POST", "/access/v1/evaluation", call, &d))
	hint := d.Context["access_request"].(map[string]any)
	call["denial"] = map[string]any{"expires_at": hint["expires_at"], "binding_token": hint["binding_token"]}
	if callback != nil {
		call["callback"] = callback
	}
	var out map[string]any
	status := do(t, env.URL, token, "POST", "/access/v1/requests", call, &out)
	return status, out
}

func approve(t *testing.T, env *backendtest.Env, id string) {
	t.Helper()
	require.Equal(t, 200, do(t, env.URL, dev.ITSMToken, "POST", "/v1/requests/"+id+"/decisions", map[string]any{"decision": "approve"}, nil))
}

func deliveriesOf(t *testing.T, env *backendtest.Env, id string) []callbacks.Delivery {
	var resp struct{ Deliveries []callbacks.Delivery }
	require.Equal(t, 200, do(t, env.URL, dev.PEPToken, "GET", "/v1/requests/"+id+"/deliveries", nil, &resp))
	return resp.Deliveries
}

func fast() []time.Duration {
	return []time.Duration{200 * time.Millisecond, 200 * time.Millisecond, 200 * time.Millisecond}
}

func TestDeliveryIsSignedAndVerifies(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{CallbackSchedule: fast()})
	rc := newReceiver(t)
	status, out := submit(t, env, dev.PEPToken, map[string]any{"endpoint": rc.URL + "/cb", "state": "task-42"})
	require.Equal(t, 202, status, "%v", out)
	id := out["task"].(map[string]any)["id"].(string)
	approve(t, env, id)
	// The receiver sees the request before the worker records the answer,
	// so wait for the record, not only for the arrival.
	require.Eventually(t, func() bool {
		ds := deliveriesOf(t, env, id)
		return len(ds) == 1 && ds[0].Status == "delivered"
	}, 30*time.Second, 50*time.Millisecond)
	require.Equal(t, 1, rc.count())

	v, err := webhook.NewVerifier(dev.PEPWebhookSecret)
	require.NoError(t, err)
	r := rc.got[0]
	gotID, err := v.Verify(r.Header, rc.bodies[0])
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(gotID, "msg_"))
	var body webhook.Body
	require.NoError(t, json.Unmarshal(rc.bodies[0], &body))
	require.Equal(t, "task-42", body.State)
	require.Equal(t, id, body.Task.ID)
	require.Equal(t, "approved", body.Task.Status)
	require.Equal(t, env.URL+"/access/v1/requests/"+id, body.Task.StatusEndpoint)
	require.NotContains(t, string(rc.bodies[0]), `"result"`, "a callback only wakes the PEP; the result stays behind the status endpoint")

	ds := deliveriesOf(t, env, id)
	require.Len(t, ds, 1)
	require.Equal(t, gotID, ds[0].ID)
	require.Equal(t, "delivered", ds[0].Status)
	require.Len(t, ds[0].Attempts, 1)
	require.Equal(t, 200, *ds[0].Attempts[0].StatusCode)

	// Rotate the secret (the old one keeps signing for an hour), then
	// redeliver by hand: the same webhook-id, signed with both secrets.
	pep, err := env.Backend.Clients().Get(context.Background(), "dev-pep")
	require.NoError(t, err)
	fresh, err := env.Backend.Callbacks().RotateSecret(context.Background(), pep.ID, time.Hour, "", "test")
	require.NoError(t, err)
	require.Equal(t, 202, do(t, env.URL, dev.PEPToken, "POST", "/v1/requests/"+id+"/deliveries/"+gotID+"/redeliver", nil, nil))
	require.Eventually(t, func() bool { return rc.count() == 2 }, 30*time.Second, 50*time.Millisecond)
	require.Equal(t, gotID, rc.got[1].Header.Get(webhook.HeaderID))
	require.Len(t, strings.Fields(rc.got[1].Header.Get(webhook.HeaderSignature)), 2)
	for _, s := range []string{fresh, dev.PEPWebhookSecret} {
		v, err := webhook.NewVerifier(s)
		require.NoError(t, err)
		_, err = v.Verify(rc.got[1].Header, rc.bodies[1])
		require.NoError(t, err, "receivers on either secret accept it during the rotation")
	}

	var metrics string
	scrape := func() string {
		resp, err := http.Get(env.URL + "/metrics")
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		metrics = string(b)
		return metrics
	}
	// The counter moves just after the commit that the test waited for.
	require.Eventually(t, func() bool {
		m := scrape()
		// The queue gauge is reported by the River leader, elected soon
		// after start.
		return strings.Contains(m, `arap_callback_deliveries_total{outcome="delivered"}`) && strings.Contains(m, "arap_callback_queue_depth")
	}, 30*time.Second, 50*time.Millisecond)
	require.Contains(t, metrics, "arap_callback_attempt_duration_seconds_bucket")
	require.Contains(t, metrics, "arap_callback_queue_depth")
	// Another client sees nothing of it.
	require.Equal(t, 403, do(t, env.URL, dev.ITSMToken, "GET", "/v1/requests/"+id+"/deliveries", nil, nil))
}

func TestRetriesKeepTheWebhookID(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{CallbackSchedule: fast()})
	rc := newReceiver(t, 500, 502)
	_, out := submit(t, env, dev.PEPToken, map[string]any{"endpoint": rc.URL + "/cb"})
	id := out["task"].(map[string]any)["id"].(string)
	approve(t, env, id)
	require.Eventually(t, func() bool {
		ds := deliveriesOf(t, env, id)
		return len(ds) == 1 && ds[0].Status == "delivered"
	}, 30*time.Second, 50*time.Millisecond)
	require.Equal(t, 3, rc.count(), "two failures, then exactly one success")
	wid := rc.got[0].Header.Get(webhook.HeaderID)
	for _, r := range rc.got {
		require.Equal(t, wid, r.Header.Get(webhook.HeaderID))
	}
	ds := deliveriesOf(t, env, id)
	require.Len(t, ds[0].Attempts, 3)
	require.Equal(t, 500, *ds[0].Attempts[0].StatusCode)
	require.Contains(t, ds[0].Attempts[0].Error, "500")
	jobFinished(t, env, ds[0].ID) // nothing more can arrive
	require.Equal(t, 3, rc.count())
}

// jobFinished waits until the River job of delivery id has finished for
// good: no attempt of it is running or still to come.
func jobFinished(t *testing.T, env *backendtest.Env, id string) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var states []string
		rows, err := env.Pool.Query(context.Background(), `SELECT state FROM river.river_job WHERE kind = $1 AND args->>'delivery_id' = $2`,
			callbacks.DeliverArgs{}.Kind(), id)
		require.NoError(c, err)
		states, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(c, err)
		require.NotEmpty(c, states, "no job for delivery %s", id)
		for _, s := range states {
			assert.Contains(c, []string{"completed", "cancelled", "discarded"}, s, "delivery %s: a job is %s", id, s)
		}
	}, 30*time.Second, 50*time.Millisecond)
}

func TestGoneStopsRetriesAndRetryAfterIsHonoured(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{CallbackSchedule: fast()})
	gone := newReceiver(t, http.StatusGone)
	_, out := submit(t, env, dev.PEPToken, map[string]any{"endpoint": gone.URL + "/cb"})
	id := out["task"].(map[string]any)["id"].(string)
	approve(t, env, id)
	require.Eventually(t, func() bool {
		ds := deliveriesOf(t, env, id)
		return len(ds) == 1 && ds[0].Status == "gone"
	}, 30*time.Second, 50*time.Millisecond)
	jobFinished(t, env, deliveriesOf(t, env, id)[0].ID)
	require.Equal(t, 1, gone.count(), "410 Gone: no retry")

	busy := newReceiver(t, http.StatusServiceUnavailable)
	_, out = submit(t, env, dev.PEPToken, map[string]any{"endpoint": busy.URL + "/cb"})
	id = out["task"].(map[string]any)["id"].(string)
	approve(t, env, id)
	require.Eventually(t, func() bool { return busy.count() == 2 }, 30*time.Second, 50*time.Millisecond)
	require.GreaterOrEqual(t, busy.at[1].Sub(busy.at[0]), 1900*time.Millisecond, "Retry-After: 2 outweighs the 200ms schedule")
}

func TestEventsAndRefusals(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{CallbackSchedule: fast()})
	ctx := context.Background()
	rc := newReceiver(t)

	// Subscribed to denials only: an approval sends nothing.
	_, out := submit(t, env, dev.PEPToken, map[string]any{"endpoint": rc.URL + "/cb", "events": []string{"denied"}})
	id := out["task"].(map[string]any)["id"].(string)
	approve(t, env, id)
	// Omitted events means every terminal event: a cancellation is sent.
	_, out = submit(t, env, dev.PEPToken, map[string]any{"endpoint": rc.URL + "/cb"})
	id2 := out["task"].(map[string]any)["id"].(string)
	require.Equal(t, 200, do(t, env.URL, dev.PEPToken, "POST", "/access/v1/requests/"+id2+"/cancel", nil, nil))
	require.Eventually(t, func() bool { return rc.count() == 1 }, 30*time.Second, 50*time.Millisecond)
	require.Contains(t, string(rc.bodies[0]), `"cancelled"`)
	require.Empty(t, deliveriesOf(t, env, id))

	// A client allowed any https URL, but no internal networks.
	pep2, token, err := env.Backend.Clients().Create(ctx, clients.New{Name: "pep2", Scopes: []string{"evaluate", "request"}, Kind: "automation",
		CallbackPrefixes: []string{"https://"}}, "test")
	require.NoError(t, err)
	_, err = env.Backend.Callbacks().RotateSecret(ctx, pep2.ID, 0, "", "test")
	require.NoError(t, err)
	for endpoint, why := range map[string]string{
		"https://10.0.0.1/cb":                       "10.0.0.1, a private address",
		"https://169.254.169.254/latest/meta-data/": "169.254.169.254, a link-local address",
		rc.URL + "/cb":                              "not under any callback prefix",
	} {
		status, p := submit(t, env, token, map[string]any{"endpoint": endpoint})
		require.Equal(t, 400, status, endpoint)
		require.Equal(t, authzen.ProblemType(authzen.ProblemCallbackRefused), p["type"])
		require.Contains(t, p["detail"], why)
	}
	status, p := submit(t, env, dev.PEPToken, map[string]any{"endpoint": rc.URL + "/cb", "events": []string{"approvedd"}})
	require.Equal(t, 400, status)
	require.Contains(t, p["detail"], `"approvedd" is not one of`)
	var n int
	require.NoError(t, env.Pool.QueryRow(ctx, `SELECT count(*) FROM arap.requests WHERE client_id = $1`, pep2.ID).Scan(&n))
	require.Zero(t, n, "a refused callback refuses the submission")
}
