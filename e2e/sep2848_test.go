package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/conformance/sep2848"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/webhook"
)

// conformanceRules are the short-lived rules the scenarios need beyond
// arapd dev's policy, picked by the beneficiary's prefix: a request that
// expires unresolved after four seconds (expiry); an approval whose grant
// provisions three seconds after it is given (retry, and the cancel that
// must win in that window); an approval valid for one second whose grant
// would provision after three, so it always expires first (approval
// expiry, and the bound on chained requests); the same with a request
// schema, so each new request asks for input in the task.
const conformanceRules = `
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
  - name: wire_transfer_provisioning
    description: An approval whose grant takes three seconds to provision.
    match: {action: tools/call, resource_type: mcp_tool, resource_id: wire_transfer}
    when: resource.properties.arguments.to.startsWith("provisioning-")
    effect: request
    approval:
      quorum: 1
      kinds: [itsm]
      grant_delay: 3s
  - name: wire_transfer_outliving
    description: An approval that expires before its grant provisions.
    match: {action: tools/call, resource_type: mcp_tool, resource_id: wire_transfer}
    when: resource.properties.arguments.to.startsWith("outliving-")
    effect: request
    approval:
      quorum: 1
      kinds: [itsm]
      approved_for: 1s
      grant_delay: 3s
  - name: wire_transfer_reinput
    description: As outliving, and every request needs a ticket.
    match: {action: tools/call, resource_type: mcp_tool, resource_id: wire_transfer}
    when: resource.properties.arguments.to.startsWith("reinput-")
    effect: request
    approval:
      quorum: 1
      kinds: [itsm]
      approved_for: 1s
      grant_delay: 3s
    request_schema:
      type: object
      required: [context]
      properties:
        context:
          type: object
          required: [ticket]
          properties:
            ticket: {type: string, minLength: 5, description: "Change ticket"}
`

// conformanceStack is a stack on arapd dev's policy plus conformanceRules,
// and the suite's configuration for it: three principals (the third spent
// on the limits), the decision API as resolver, able to cancel at the
// backend as the front-end's client.
func conformanceStack(t *testing.T, o stackOptions) (*stack, sep2848.Config) {
	o.policy = strings.Replace(string(dev.SeedPolicy()), "\nrules:\n", "\nrules:"+conformanceRules, 1)
	require.Contains(t, o.policy, "wire_transfer_outliving")
	s := newStack(t, o)
	limits := token(arapctl(t, s.env, "callers", "create", "limits-agent", "--subject", "limits-user", "--actor", "agent:demo"))
	p := sep2848.DevProfile()
	gated := func(prefix string) sep2848.Call {
		return sep2848.Call{Name: "wire_transfer", Arguments: map[string]any{"to": prefix + "-{nonce}", "amount": 50000}}
	}
	expiring := gated("expiring")
	p.Expiring, p.ExpiresWithin = &expiring, sep2848.Duration(4*time.Second)
	p.Provisioning = &sep2848.Delayed{Call: gated("provisioning"), After: sep2848.Duration(3 * time.Second)}
	p.Outliving = &sep2848.Delayed{Call: gated("outliving"), After: sep2848.Duration(3 * time.Second)}
	p.Reinput = &sep2848.Delayed{Call: gated("reinput"), After: sep2848.Duration(3 * time.Second)}
	require.Equal(t, 3, p.MaxRequests, "pep.Config.MaxChained's default")
	return s, sep2848.Config{
		URL: s.mcp.url() + "/mcp", Token: s.alice, OtherToken: s.mallory, LimitsToken: limits, Profile: p,
		Resolver:   &sep2848.DecisionAPI{URL: s.api, Token: s.itsmToken, CancelToken: s.pepToken},
		BackendURL: s.api, Log: tlog{t},
	}
}

type tlog struct{ t *testing.T }

func (l tlog) Write(b []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// TestSEP2848Conformance runs our own SEP-2848 scenarios against arapd mcp:
// every check passes and none is skipped. The outcome-unknown scenario
// needs a claimed run whose result is never recorded, which a kill -9 of
// the front-end makes: once right after the claim (the tool never ran) and
// once right after the invocation (it ran once).
func TestSEP2848Conformance(t *testing.T) {
	t.Parallel()
	s, cfg := conformanceStack(t, stackOptions{})
	results := sep2848.Run(context.Background(), cfg)
	require.Len(t, results, len(sep2848.Checks), "every registered check reports")
	passed, failed, skipped := sep2848.Summary(results)
	t.Logf("SEP-2848 conformance: %d passed, %d failed, %d skipped", passed, failed, skipped)
	for _, r := range results {
		switch {
		case r.Outcome == sep2848.Failed:
			t.Errorf("%s failed: %s", r.ID, r.Detail)
		case r.Outcome == sep2848.Skipped && r.Scenario != "outcome-unknown":
			t.Errorf("%s skipped: %s", r.ID, r.Detail)
		}
	}

	for _, c := range []struct {
		point   string
		effects int
	}{{"pep.after-claim", 0}, {"pep.after-invoke", 1}} {
		t.Run("outcome-unknown at "+c.point, func(t *testing.T) {
			s.mcp.cmd.Process.Kill()
			s.mcp.wait(10 * time.Second)
			s.mcp = s.startFaultyMCP(c.point)
			cfg := cfg
			cfg.Profile.Stalling = &sep2848.Stalling{Call: cfg.Profile.Gated, For: sep2848.Duration(10 * time.Second), Effects: &c.effects}
			cfg.Scenarios = []string{"outcome-unknown"}
			// If an assertion below stops the subtest, the run is cancelled
			// and waited for, so it never logs to a finished test.
			ctx, cancel := context.WithCancel(context.Background())
			done, finished := make(chan []sep2848.Result, 1), make(chan struct{})
			go func() { defer close(finished); done <- sep2848.Run(ctx, cfg) }()
			t.Cleanup(func() { cancel(); <-finished })
			require.Equal(t, -1, s.mcp.wait(60*time.Second), "killed at %s", c.point)
			s.mcp = s.startMCP()
			results := <-done
			require.Len(t, results, 3)
			for _, r := range results {
				require.Equal(t, sep2848.Passed, r.Outcome, "%s: %s", r.ID, r.Detail)
			}
		})
	}
}

// brokenBuilds is the proof that the checks can fail: for each violation
// the deliberately broken build (-tags arapbroken, ARAP_BROKEN) can commit,
// the scenarios that should see it and exactly the checks they must fail
// (every other check of those scenarios must pass), with what the first
// one's detail must say, so it fails for the right reason.
var brokenBuilds = []struct {
	violation string
	scenarios []string
	fail      []string
	because   string
}{
	// Execution where the SEP forbids it, and how often.
	{"execute-on-requestable-denial", []string{"requestable-denial", "deny"},
		[]string{"requestable-denial-not-executed", "denial-not-executed"}, "the tool ran"},
	{"execute-after-denial", []string{"deny"}, []string{"denial-not-executed"}, "the tool ran"},
	{"execute-after-cancel", []string{"cancel"}, []string{"cancelled-never-executes", "cancel-race-one-outcome"}, "the tool ran"},
	{"cancel-ignored", []string{"cancel"}, []string{"cancel-wins-before-claim", "cancelled-never-executes", "cancelled-no-disposition"}, "after tasks/cancel"},
	{"execute-after-expiry", []string{"approval-expiry"}, []string{"expired-never-executes", "chain-bounded"}, "the tool ran on an expired approval"},
	{"second-execution", []string{"approve"}, []string{"executes-once"}, "the tool ran 2 times"},
	{"arguments-truncated", []string{"approve"}, []string{"runs-from-full-binding"}, "does not repeat argument to"},
	// What the result says.
	{"disposition-disagrees", []string{"deny", "artifacts"}, []string{"denial-disposition", "body-disposition-agree"}, `disposition "approved-executed"`},
	{"no-disposition", []string{"approve"}, []string{"approval-executes"}, `disposition ""`},
	{"body-silent-on-run", []string{"approve"}, []string{"body-states-ran"}, "does not say the tool ran"},
	{"denial-silent-on-run", []string{"deny"}, []string{"denial-body-states-not-run"}, "does not say the tool did not run"},
	{"execution-error-says-not-run", []string{"execution-error"}, []string{"execution-error-body-distinct"}, "does not say the tool ran"},
	{"execution-error-as-success", []string{"execution-error"}, []string{"execution-error-disposition"}, `disposition "approved-executed"`},
	{"expiry-unexplained", []string{"expiry"}, []string{"expired-denied"}, "expired task"},
	// The envelope.
	{"envelope-on-executed", []string{"approve", "execution-error"}, []string{"no-envelope-on-success", "no-envelope-on-execution-error"}, "envelope on an executed task"},
	{"pending-without-envelope", []string{"requestable-denial"}, []string{"envelope-on-create", "envelope-repeated-on-get"}, "no io.modelcontextprotocol/authorization"},
	{"denial-without-envelope", []string{"deny"}, []string{"denial-envelope-unavailable"}, "no io.modelcontextprotocol/authorization"},
	{"input-without-envelope", []string{"in-task-input"}, []string{"input-required-envelope"}, "no io.modelcontextprotocol/authorization"},
	// What reaches the client.
	{"artifact-leak", []string{"approve", "artifacts"}, []string{"no-backend-artifacts"}, "binding_token"},
	{"authorization-context-id", []string{"approve", "artifacts"}, []string{"no-authorization-context-id"}, "authorizationContextId"},
	{"status-repeats-arguments", []string{"requestable-denial"}, []string{"model-text-sanitized"}, "repeats the client-supplied argument"},
	{"pending-shown-done", []string{"requestable-denial"}, []string{"pending-not-presented-completed"}, "Transfer completed"},
	// Who may do what to a task, and what a call binds.
	{"other-principals-task", []string{"access-control"}, []string{"task-access-get", "task-access-update", "task-access-cancel"}, "another principal read the task"},
	{"clock-task-ids", []string{"access-control"}, []string{"task-id-unguessable"}, "differ in only"},
	{"mrtr-unbound", []string{"input"}, []string{"mrtr-binding-enforced", "mrtr-caller-enforced"}, "was accepted"},
	{"terminal-reopened", []string{"approve"}, []string{"terminal-not-reopened"}, "the identical call returned task"},
	{"dedup-off", []string{"dedup"}, []string{"dedup-same-task", "dedup-concurrent"}, "opened task"},
	{"dedup-across-principals", []string{"changed-binding"}, []string{"changed-principal-new-approval"}, "was handed the first principal's task"},
	{"plain-denial-as-error", []string{"plain-denial"}, []string{"plain-denial-no-task"}, "a JSON-RPC error"},
	{"limits-off", []string{"limits"}, []string{"pending-bounded", "submission-rate-limited"}, "was not refused"},
	// Waiting: retry, expiry, the bound on requests, backend cancellation.
	{"retry-as-denial", []string{"retry"}, []string{"retry-not-denial"}, "a retryable outcome ended the task denied-not-executed"},
	{"retry-past-expiry", []string{"approval-expiry"}, []string{"retry-stops-at-expiry", "chain-bounded"}, "the task still waits"},
	{"chain-unbounded", []string{"approval-expiry"}, []string{"chain-bounded"}, "the task still waits"},
	{"backend-cancel-ignored", []string{"cancel"}, []string{"backend-cancel-cancelled"}, "did not end"},
	{"no-retention", []string{"requestable-denial"}, []string{"ttl-covers-pending"}, "does not cover"},
	// Clients: tasks-only, approval-aware, none.
	{"needs-tool-approval", []string{"requestable-denial"}, []string{"tool-approval-optional", "requestable-denial-returns-task",
		"requestable-denial-not-executed", "envelope-on-create", "envelope-repeated-on-get", "pending-not-presented-completed",
		"model-text-sanitized", "ttl-covers-pending"}, "a tasks-only client got"},
	{"plain-clients-get-tasks", []string{"degraded"}, []string{"degraded-without-tasks", "degraded-preferred", "task-required-error"}, "without the tasks extension the call answered"},
	{"tool-approval-undeclared", []string{"capability"}, []string{"capability-declared"}, "need both"},
}

// TestSEP2848CatchesBrokenBuild runs the scenarios against a deliberately
// broken build of arapd, once per violation (a fresh stack each, so no
// violation's leftovers act during another's run), and requires exactly
// the expected checks to fail. ARAP_SEP2848_BROKEN picks the violations:
// "all", or a comma-separated list. Unset, the test skips: building the
// broken arapd and its stacks costs minutes of e2e's ten (go test's
// per-package limit) on a loaded machine, and CI runs every violation in
// a step of its own (.ci/run). The release build must know nothing of it.
func TestSEP2848CatchesBrokenBuild(t *testing.T) {
	pick := os.Getenv("ARAP_SEP2848_BROKEN")
	if pick == "" {
		t.Skip("ARAP_SEP2848_BROKEN is not set: .ci/run's broken-build step runs every violation")
	}
	t.Parallel()
	release, err := os.ReadFile(filepath.Join(binDir, "arapd"))
	require.NoError(t, buildErr)
	require.NoError(t, err)
	// (Not require.NotContains: on failure it would print the binary.)
	require.False(t, bytes.Contains(release, []byte("ARAP_BROKEN")), "the release build reads no violation")
	for _, b := range brokenBuilds {
		require.False(t, bytes.Contains(release, []byte(b.violation)), "the release build holds the branch of violation %s", b.violation)
	}
	bin := filepath.Join(t.TempDir(), "arapd-broken")
	out, err := osexec.Command("go", "build", "-tags", "arapbroken", "-o", bin, "../cmd/arapd").CombinedOutput()
	require.NoError(t, err, "%s", out)
	cmd := osexec.Command(bin, "migrate")
	cmd.Env = append(os.Environ(), "ARAP_BROKEN=no-such-violation")
	out, err = cmd.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "no such violation", "a misspelt violation stops the process")

	ran := 0
	for _, b := range brokenBuilds {
		if pick != "all" && !slices.Contains(strings.Split(pick, ","), b.violation) {
			continue
		}
		ran++
		t.Run(b.violation, func(t *testing.T) {
			_, cfg := conformanceStack(t, stackOptions{mcpBinary: bin, mcpEnv: []string{"ARAP_BROKEN=" + b.violation}})
			cfg.Scenarios = b.scenarios
			// A violation that leaves a task waiting should cost seconds,
			// not the two minutes a slow server is given.
			cfg.Timeout = 20 * time.Second
			results := sep2848.Run(context.Background(), cfg)
			failed := map[string]string{}
			for _, r := range results {
				switch r.Outcome {
				case sep2848.Failed:
					failed[strings.TrimPrefix(r.ID, "sep-2848-")] = r.Detail
				case sep2848.Skipped:
					t.Errorf("%s skipped: %s", r.ID, r.Detail)
				}
			}
			t.Logf("failed against ARAP_BROKEN=%s: %v", b.violation, failed)
			require.ElementsMatch(t, b.fail, slices.Collect(maps.Keys(failed)), "the checks that failed")
			require.Contains(t, failed[b.fail[0]], b.because, "%s must fail because of the violation, not for another reason", b.fail[0])
		})
	}
	require.Positive(t, ran, "ARAP_SEP2848_BROKEN=%q names no violation", pick)
}

// TestFailedApprovalTaskCarriesError: the lifecycle's failed row. A task
// fails only before its claim, on a backend or infrastructure failure; here
// the backend refuses the submission (the front-end's client lacks scope
// request). The call answers a JSON-RPC error and the task, read by its
// owner, is failed with the SEP-2663 error object and nothing else: no
// result, no disposition, no envelope. Nothing was requested or run.
func TestFailedApprovalTaskCarriesError(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{})
	ctx := context.Background()
	weak := token(arapctl(t, s.env, "clients", "create", "--name", "pep-evaluate-only", "--scope", "evaluate", "--actor", "agent:*"))
	require.NoError(t, s.mcp.cmd.Process.Kill())
	s.mcp.wait(10 * time.Second)
	s.mcp = s.startMCP("ARAP_BACKEND_TOKEN=" + weak)
	alice := s.client(s.alice)
	_, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-refused", "amount": 50000}, nil)
	requireRPC(t, err, -32603, "could not be submitted")
	var id string
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT id FROM pep.tasks ORDER BY created_at DESC LIMIT 1`).Scan(&id))
	d, raw, err := alice.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, tasks.Failed, d.Status)
	require.NotNil(t, d.Error, "a failed task carries the error object")
	require.Equal(t, -32603, d.Error.Code)
	require.NotEmpty(t, d.Error.Message)
	require.Empty(t, d.Result)
	require.NotContains(t, string(raw), "io.modelcontextprotocol/tool-approval-disposition")
	require.NotContains(t, string(raw), "io.modelcontextprotocol/authorization")
	require.Empty(t, s.pendingRequests())
	require.Zero(t, s.ledger(id))
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
	// The task ends first, then its request is cancelled: wait for it.
	req := s.requestOf(r.Task.TaskID)
	require.Eventually(t, func() bool {
		var status string
		return s.pool.QueryRow(ctx, `SELECT status FROM arap.requests WHERE id = $1`, req).Scan(&status) == nil && status == "cancelled"
	}, 60*time.Second, 50*time.Millisecond, "the backend request is cancelled")
}

// TestForgedCallbackCannotExecute: a callback only wakes a task. A forged
// one (wrong key) is refused; an authentic one claiming approval while the
// request is pending changes nothing, because the front-end re-reads the
// ARAP status endpoint; the same callback replayed is answered (200: a
// sender that lost our answer stops retrying) but not handled again.
func TestForgedCallbackCannotExecute(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{})
	ctx := context.Background()
	alice := s.client(s.alice)
	r, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-forged", "amount": 40000}, nil)
	require.NoError(t, err)
	id := r.Task.TaskID
	body, err := json.Marshal(webhook.Body{State: id, Task: authzen.Task{ID: s.requestOf(id), Status: authzen.StatusApproved}})
	require.NoError(t, err)
	send := func(key []byte, msgID string) int {
		ts := time.Now().Unix()
		req, err := http.NewRequest(http.MethodPost, s.mcp.url()+"/callbacks/arap", bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(webhook.HeaderID, msgID)
		req.Header.Set(webhook.HeaderTimestamp, strconv.FormatInt(ts, 10))
		req.Header.Set(webhook.HeaderSignature, webhook.SignatureHeader([][]byte{key}, msgID, ts, body))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	forged, err := webhook.ParseSecret(webhook.NewSecret())
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, send(forged, "msg_forged"))
	real, err := webhook.ParseSecret(s.secret)
	require.NoError(t, err)
	// The woken task re-reads the status endpoint, which still says
	// pending: it must not act. With no look scheduled, only the wake-up
	// moves the task, and its look, once done, schedules the next one
	// (pep.Gate.Advance): that is the event to wait for.
	_, err = s.pool.Exec(ctx, `UPDATE pep.approval_tasks SET look_at = NULL WHERE task_id = $1`, id)
	require.NoError(t, err)
	acted := func() error {
		d, _, err := alice.Get(ctx, id)
		if err != nil {
			return err
		}
		ran, err := s.ledgerCount(id)
		if err != nil {
			return err
		}
		if d.Status != tasks.Working || ran != 0 {
			return fmt.Errorf("the task acted on a callback while its request is pending: %s, %d runs", d.Status, ran)
		}
		return nil
	}
	require.Equal(t, http.StatusNoContent, send(real, "msg_authentic"), "authentic: accepted as a wake-up")
	require.Eventually(t, func() bool {
		var looked bool
		err := s.pool.QueryRow(ctx, `SELECT look_at IS NOT NULL FROM pep.approval_tasks WHERE task_id = $1`, id).Scan(&looked)
		return err != nil || looked || acted() != nil
	}, 60*time.Second, 20*time.Millisecond, "the wake-up never looked at the task")
	require.NoError(t, acted())
	require.Equal(t, http.StatusOK, send(real, "msg_authentic"), "replayed: answered as handled")
	// The replay memory is the database's, not the process's: a restarted
	// front-end still knows the id was handled.
	s.mcp.signal(syscall.SIGTERM)
	require.Equal(t, 0, s.mcp.wait(30*time.Second))
	s.mcp = s.startMCP()
	require.Equal(t, http.StatusOK, send(real, "msg_authentic"), "replayed after a restart: answered as handled")
	// The front-end that was woken exited cleanly, which waits for every
	// wake-up in flight (pep.Gate.Stop), and the replays woke nothing.
	require.NoError(t, acted())
}
