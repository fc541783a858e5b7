package e2e

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/callbacks"
	"github.com/omcp/arap/internal/contract"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/webhook"
)

// TestCallbackSurvivesCrashAfterDecision kills the backend (SIGKILL, at the
// named fault point right after the approval commits) and restarts it: the
// callback, enqueued in the same transaction as the approval, is delivered,
// signed, and accepted once. The dying process's workers may already have
// taken the job between the commit and the kill (more likely on a busy
// machine); its attempt is refused, as a receiver that is down would, so
// that what the survivor does is what is checked, and every attempt
// carries the same webhook-id, by which a receiver that did accept one
// recognises the next.
func TestCallbackSurvivesCrashAfterDecision(t *testing.T) {
	t.Parallel()
	dbURL := dbtest.URL(t)
	env := []string{"DATABASE_URL=" + dbURL, "ARAP_MASTER_KEY=" + masterKey}
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	require.NoError(t, os.WriteFile(policy, []byte(`version: 1
rules:
  - name: wire_transfer_large
    match: {resource_id: wire_transfer}
    effect: request
    approval: {kinds: [itsm]}
`), 0o600))
	out := arapctl(t, env, "clients", "create", "--name", "pep", "--scope", "evaluate,request", "--actor", "agent:*",
		"--callback-prefix", "http://127.0.0.1:", "--callback-network", "loopback")
	pepToken := regexp.MustCompile(`token: (\S+)`).FindStringSubmatch(out)[1]
	out = arapctl(t, env, "clients", "create", "--name", "itsm", "--scope", "decide", "--kind", "itsm")
	itsmToken := regexp.MustCompile(`token: (\S+)`).FindStringSubmatch(out)[1]
	// The master key must exist in the database's key table first: start once.
	// A short job timeout: if the dying process had already claimed the
	// delivery job, the survivor rescues it after twice this.
	args := []string{"serve", "--addr", "127.0.0.1:0", "--policy", policy, "--job-timeout", "5s"}
	crashing := startArapd(t, append(env, "ARAP_FAULT=requests.after-decision-commit"), args...)
	out = arapctl(t, env, "clients", "secret", "rotate", "pep")
	secret := regexp.MustCompile(`(whsec_\S+)`).FindStringSubmatch(out)[1]

	var mu sync.Mutex
	var got []*http.Request // accepted
	var bodies [][]byte
	var ids []string // of every attempt
	accepting := false
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		ids = append(ids, r.Header.Get(webhook.HeaderID))
		if !accepting {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		got, bodies = append(got, r), append(bodies, b)
	}))
	defer rc.Close()

	api := contract.Proxy(t, crashing.url(), nil)
	call := toolCall("wire_transfer", map[string]any{"to": "acct-991", "amount": 50000})
	status, d := postJSON(t, api+"/access/v1/evaluation", pepToken, call)
	require.Equal(t, 200, status)
	hint := d["context"].(map[string]any)["access_request"].(map[string]any)
	call["denial"] = map[string]any{"expires_at": hint["expires_at"], "binding_token": hint["binding_token"]}
	call["callback"] = map[string]any{"endpoint": rc.URL + "/arap-callback", "state": "s-1"}
	status, r := postJSON(t, api+"/access/v1/requests", pepToken, call)
	require.Equal(t, 202, status, "%v", r)
	id := r["task"].(map[string]any)["id"].(string)

	// The approval commits, then the process is killed before answering
	// (directly: through the proxy the lost answer would be a 502).
	req, _ := http.NewRequest("POST", crashing.url()+"/v1/requests/"+id+"/decisions", stringsReader(`{"decision":"approve"}`))
	req.Header.Set("Authorization", "Bearer "+itsmToken)
	req.Header.Set("Content-Type", "application/json")
	_, err := http.DefaultClient.Do(req)
	require.Error(t, err, "the backend dies before it can answer")
	require.Equal(t, -1, crashing.wait(10*time.Second), "killed by SIGKILL")

	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	defer pool.Close()
	var reqStatus, delivery string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT status FROM arap.requests WHERE id = $1`, id).Scan(&reqStatus))
	require.Equal(t, "approved", reqStatus, "the approval committed before the crash")
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT status FROM arap.deliveries WHERE request_id = $1`, id).Scan(&delivery))
	mu.Lock()
	attempted := len(ids)
	accepting = true
	mu.Unlock()
	if attempted == 0 {
		require.Equal(t, "pending", delivery, "the delivery job survived the crash, waiting")
	}

	var jobState string
	var attempt int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT state, attempt FROM river.river_job WHERE kind = 'callbacks.deliver'`).Scan(&jobState, &attempt))
	t.Logf("delivery job after the crash: %s (attempt %d)", jobState, attempt)
	startArapd(t, env, args...)
	// Wait until nothing more can be sent: the delivery is recorded as
	// delivered and every delivery job has finished (one the dead process
	// had claimed is rescued after twice the job timeout, then runs).
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var status string
		var unfinished int
		require.NoError(c, pool.QueryRow(context.Background(), `SELECT status FROM arap.deliveries WHERE request_id = $1`, id).Scan(&status))
		require.NoError(c, pool.QueryRow(context.Background(), `SELECT count(*) FROM river.river_job WHERE kind = $1
			AND state NOT IN ('completed', 'cancelled', 'discarded')`, callbacks.DeliverArgs{}.Kind()).Scan(&unfinished))
		assert.Equal(c, "delivered", status)
		assert.Zero(c, unfinished, "delivery jobs not finished")
	}, 3*time.Minute, 100*time.Millisecond) // a rescue can take a minute: the survivor's leadership, River's 30 s rescuer
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 1, "accepted once")
	for _, wid := range ids {
		require.Equal(t, got[0].Header.Get(webhook.HeaderID), wid, "every attempt is the same message")
	}
	v, err := webhook.NewVerifier(secret)
	require.NoError(t, err)
	_, err = v.Verify(got[0].Header, bodies[0])
	require.NoError(t, err)
	require.Contains(t, string(bodies[0]), id)
}
