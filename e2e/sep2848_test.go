package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/callbacks"
	"github.com/omcp/arap/conformance/sep2848"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/mcp/tasks"
)

// expiringRule makes wire transfers to expiring-... accounts requests that
// expire, unresolved, after four seconds (the expiry scenario).
const expiringRule = `
  - name: wire_transfer_expiring
    description: A request that nobody decides in time.
    match: {action: tools/call, resource_type: mcp_tool, resource_id: wire_transfer}
    when: resource.properties.arguments.to.startsWith("expiring-")
    effect: request
    template: expiring_approval
    request_ttl: 4s
    approval:
      quorum: 1
      kinds: [itsm]
`

func conformanceStack(t *testing.T, mcpBinary string) (*stack, sep2848.Config) {
	policy := strings.Replace(string(dev.SeedPolicy()), "\nrules:\n", "\nrules:"+expiringRule, 1)
	require.Contains(t, policy, "wire_transfer_expiring")
	s := newStack(t, stackOptions{policy: policy, mcpBinary: mcpBinary})
	p := sep2848.DevProfile()
	p.Expiring = &sep2848.Call{Name: "wire_transfer", Arguments: map[string]any{"to": "expiring-{nonce}", "amount": 50000}}
	p.ExpiresWithin = sep2848.Duration(4 * time.Second)
	return s, sep2848.Config{
		URL: s.mcp.url() + "/mcp", Token: s.alice, OtherToken: s.mallory, Profile: p,
		Resolver:   &sep2848.DecisionAPI{URL: s.api, Token: s.itsmToken},
		BackendURL: s.backend.url(), Log: tlog{t},
	}
}

type tlog struct{ t *testing.T }

func (l tlog) Write(b []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// TestSEP2848Conformance runs our own SEP-2848 scenarios against arapd mcp:
// every check passes, and only the checks this deployment cannot show from
// outside are skipped.
func TestSEP2848Conformance(t *testing.T) {
	t.Parallel()
	s, cfg := conformanceStack(t, "")
	results := sep2848.Run(context.Background(), cfg)
	require.Len(t, results, len(sep2848.Checks), "every registered check reports")
	passed, failed, skipped := sep2848.Summary(results)
	t.Logf("SEP-2848 conformance: %d passed, %d failed, %d skipped", passed, failed, skipped)
	for _, r := range results {
		switch {
		case r.Outcome == sep2848.Failed:
			t.Errorf("%s failed: %s", r.ID, r.Detail)
		case r.Outcome == sep2848.Skipped && r.ID != outcomeUnknown:
			t.Errorf("%s skipped: %s", r.ID, r.Detail)
		}
	}

	// outcome-unknown needs a claimed run whose result is never recorded:
	// the front-end is killed (SIGKILL) right after the claim and restarted,
	// and from outside the approved task merely stalls, then settles.
	t.Run(outcomeUnknown, func(t *testing.T) {
		s.mcp.cmd.Process.Kill()
		s.mcp.wait(10 * time.Second)
		s.mcp = s.startFaultyMCP("pep.after-claim")
		cfg.Profile.Stalling = &cfg.Profile.Gated
		cfg.Profile.StallsFor = sep2848.Duration(10 * time.Second)
		cfg.Scenarios = []string{"outcome-unknown"}
		// If an assertion below stops the subtest, the run is cancelled and
		// waited for, so it never logs to a finished test.
		ctx, cancel := context.WithCancel(context.Background())
		done, finished := make(chan []sep2848.Result, 1), make(chan struct{})
		go func() { defer close(finished); done <- sep2848.Run(ctx, cfg) }()
		t.Cleanup(func() { cancel(); <-finished })
		require.Equal(t, -1, s.mcp.wait(60*time.Second), "killed at the claim")
		s.mcp = s.startMCP()
		results := <-done
		require.Len(t, results, 1)
		require.Equal(t, sep2848.Passed, results[0].Outcome, results[0].Detail)
	})
}

const outcomeUnknown = "sep-2848-outcome-unknown-disposition"

// TestSEP2848CatchesBrokenBuild runs the scenarios against a deliberately
// broken build of arapd (tag arapbroken: it executes the tool on a
// requestable denial) and requires the suite to catch it.
func TestSEP2848CatchesBrokenBuild(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "arapd-broken")
	out, err := osexec.Command("go", "build", "-tags", "arapbroken", "-o", bin, "../cmd/arapd").CombinedOutput()
	require.NoError(t, err, "%s", out)
	_, cfg := conformanceStack(t, bin)
	cfg.Scenarios = []string{"requestable-denial", "deny", "cancel"}
	results := sep2848.Run(context.Background(), cfg)
	failed := map[string]string{}
	for _, r := range results {
		if r.Outcome == sep2848.Failed {
			failed[r.ID] = r.Detail
		}
	}
	t.Logf("failed against the broken build: %v", failed)
	for _, id := range []string{"sep-2848-requestable-denial-not-executed", "sep-2848-denial-not-executed", "sep-2848-cancelled-never-executes"} {
		require.Contains(t, failed, id, "the suite must catch execution on a requestable denial")
		require.Contains(t, failed[id], "the tool ran", "%s must fail because it saw the tool run, not for another reason", id)
	}
}

// TestMaxWindowEndsLongPendingTasks: the front-end bounds the window it
// accepts (SEP-2848 Retention: pending tasks must not accumulate without
// limit). The backend would wait 24 hours; the task ends denied after the
// front-end's three seconds, and the backend request is cancelled.
func TestMaxWindowEndsLongPendingTasks(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{mcpArgs: []string{"--max-window", "3s"}})
	ctx := context.Background()
	alice := s.client(s.alice)
	r, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-window", "amount": 40000}, nil)
	require.NoError(t, err)
	require.NotNil(t, r.Task)
	require.NotNil(t, r.Task.TTLMs)
	d := s.waitTask(alice, r.Task.TaskID)
	text, m, isError := resultText(t, d)
	require.True(t, isError)
	require.Equal(t, "denied-not-executed", m["io.modelcontextprotocol/tool-approval-disposition"])
	require.Contains(t, text, "did not run")
	require.Zero(t, s.ledger(r.Task.TaskID))
	var status string
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT status FROM arap.requests WHERE id = $1`, s.requestOf(r.Task.TaskID)).Scan(&status))
	require.Equal(t, "cancelled", status)
}

// TestForgedCallbackCannotExecute: a callback only wakes a task. A forged
// one (wrong key) is refused; an authentic one claiming approval while the
// request is pending changes nothing, because the front-end re-reads the
// ARAP status endpoint; the same callback replayed is refused.
func TestForgedCallbackCannotExecute(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{})
	ctx := context.Background()
	alice := s.client(s.alice)
	r, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-forged", "amount": 40000}, nil)
	require.NoError(t, err)
	id := r.Task.TaskID
	body, err := json.Marshal(callbacks.Body{State: id, Task: authzen.Task{ID: s.requestOf(id), Status: authzen.StatusApproved}})
	require.NoError(t, err)
	send := func(key []byte, msgID string) int {
		ts := time.Now().Unix()
		req, err := http.NewRequest(http.MethodPost, s.mcp.url()+"/callbacks/arap", bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(callbacks.HeaderID, msgID)
		req.Header.Set(callbacks.HeaderTimestamp, strconv.FormatInt(ts, 10))
		req.Header.Set(callbacks.HeaderSignature, callbacks.SignatureHeader([][]byte{key}, msgID, ts, body))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	forged, err := callbacks.ParseSecret(callbacks.NewSecret())
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, send(forged, "msg_forged"))
	real, err := callbacks.ParseSecret(s.secret)
	require.NoError(t, err)
	require.Equal(t, http.StatusNoContent, send(real, "msg_authentic"), "authentic: accepted as a wake-up")
	require.Equal(t, http.StatusConflict, send(real, "msg_authentic"), "replayed")
	// The replay memory is the database's, not the process's: a restarted
	// front-end still refuses the id.
	s.mcp.signal(syscall.SIGTERM)
	require.Equal(t, 0, s.mcp.wait(30*time.Second))
	s.mcp = s.startMCP()
	require.Equal(t, http.StatusConflict, send(real, "msg_authentic"), "replayed after a restart")
	// The woken task re-reads the status endpoint, which still says
	// pending: it must not act. A pending task writes nothing when it is
	// right (its next poll is the 30 s safety poll), so there is no event to
	// wait for; the window is watched instead, failing as soon as it acts.
	require.Never(t, func() bool {
		d, _, err := alice.Get(ctx, id)
		ran, lerr := s.ledgerCount(id)
		return err != nil || d.Status != tasks.Working || lerr != nil || ran != 0
	}, 3*time.Second, 100*time.Millisecond, "the task acted on a callback while its request is pending")
}
