package pep_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
)

// wait receives from ch or fails the test after a minute (a step that never
// came).
func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("timed out waiting for %s", what)
		var zero T
		return zero
	}
}

// task reads a task from the store (its caller's token may be revoked).
func (p *stack) task(t *testing.T, id string) *tasks.Detailed {
	t.Helper()
	tk, err := p.gate.Tasks().Get(context.Background(), p.db, id)
	require.NoError(t, err)
	d := tk.Detailed()
	return &d
}

// TestStaleCallbackForConsumedGeneration: once a task has consumed a
// generation (re-evaluation with its approval asked for a new request, and
// the task chained to it), nothing about that generation acts on the task:
// not a signed callback about its request, not a runner that read the task
// at that generation and was allowed then, not one that re-evaluates with
// its approval now (it may not open yet another request).
func TestStaleCallbackForConsumedGeneration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPEP(t, pepOptions{})
	id := p.transfer(t, 50001)
	first := p.request(t, id)
	p.approve(t, first, time.Time{})
	approval := p.approval(t, first)
	stale, err := p.gate.Snapshot(ctx, id)
	require.NoError(t, err)
	require.Equal(t, 1, stale.Generation)

	// The approval is revoked before the task used it: re-evaluation says
	// approval_expired, next_action request; the task consumes generation 1
	// and opens a second request.
	code, out := p.backendAPI(t, dev.ITSMToken, "POST", "/v1/approvals/"+approval.ID+"/revoke", map[string]any{"reason": "wrong beneficiary"})
	require.Equal(t, 200, code, "%v", out)
	p.advance(t, id)
	second := p.request(t, id)
	require.NotEqual(t, first, second)
	now, err := p.gate.Snapshot(ctx, id)
	require.NoError(t, err)
	require.Equal(t, 2, now.Generation)
	requests := func() int {
		var n int
		require.NoError(t, p.env.Pool.QueryRow(ctx, `SELECT count(*) FROM arap.requests WHERE resource->'properties'->'arguments'->>'to' = 'acct-50001'`).Scan(&n))
		return n
	}
	require.Equal(t, 2, requests())

	// A signed, fresh callback about the first request: accepted (it is
	// authentic), but it only wakes the task, and the task reads its current
	// request, which is pending.
	require.Equal(t, http.StatusNoContent, p.callback(t, id, first, "approved"))
	p.advance(t, id)
	// A runner that read generation 1 and was allowed with its approval
	// (before the revocation) acts only now: its claim is for a consumed
	// generation.
	require.NoError(t, p.gate.ExecuteSnapshot(ctx, stale, approval.ID, approval.ApprovedUntil))
	// A runner that read generation 1 re-evaluates with its approval now:
	// told to request anew, it may not chain a generation already consumed.
	require.NoError(t, p.gate.ReevaluateSnapshot(ctx, stale, approval))

	require.Zero(t, p.ledger(t, id), "never run on a consumed generation's approval")
	require.Equal(t, tasks.Working, p.get(t, id).Status)
	after, err := p.gate.Snapshot(ctx, id)
	require.NoError(t, err)
	require.Equal(t, 2, after.Generation)
	require.EqualValues(t, "pending", after.Phase)
	require.Equal(t, second, p.request(t, id), "still waiting on the second request")
	require.Equal(t, 2, requests(), "no third request opened for a consumed generation")
	require.Empty(t, p.trail(t, id), "nothing was claimed or ended")
}

// TestCallerInvalidAtExecution: an approval never outlives the caller it
// was for. A caller whose every token is revoked after the approval (before
// the task is advanced, or while the PDP re-evaluates, the last step before
// the claim) gets denied-not-executed, and the tool does not run: the
// caller's validity is part of the claim's compare-and-set.
func TestCallerInvalidAtExecution(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPEP(t, pepOptions{})
	check := func(id string) {
		t.Helper()
		d := p.task(t, id)
		require.Equal(t, pep.DeniedNotExecuted, disposition(t, d))
		require.Contains(t, string(d.Result), "The caller is no longer authorized")
		require.Zero(t, p.ledger(t, id))
		require.Equal(t, []string{pep.AuditDenied}, p.trail(t, id), "no claim recorded")
	}

	// Revoked between the approval and the next look at the task.
	id := p.transfer(t, 50002)
	p.approve(t, p.request(t, id), time.Time{})
	require.NoError(t, p.gate.Callers().Revoke(ctx, "alice-agent"))
	p.advance(t, id)
	check(id)

	// A new token for the same principal; revoked while the PDP
	// re-evaluates the approved call (which it allows: the PDP knows nothing
	// of MCP tokens).
	const token2 = "alice-token-4567"
	require.NoError(t, p.gate.Callers().Create(ctx, "alice-agent-2", token2, pep.Principal{SubjectType: "user", SubjectID: "alice", ActorID: "agent:demo"}))
	p.alice.Token = token2
	id = p.transfer(t, 50003)
	p.approve(t, p.request(t, id), time.Time{})
	p.onBackend(func(r *http.Request, body []byte) {
		if reevaluation(r, body) {
			require.NoError(t, p.gate.Callers().Revoke(ctx, "alice-agent-2"))
		}
	})
	p.advance(t, id)
	p.onBackend(nil)
	check(id)
	p.requireIntact(t)
}

// TestCallerRevocationInFlightStopsTheClaim (issue 40, item 4): a caller's
// revocation and the claim are serialized on the caller's row. A claim made
// while a revocation is in flight (written, uncommitted) waits for it and,
// once it commits, does not claim: the revoker is never told "revoked"
// while a claim made with the caller commits after.
func TestCallerRevocationInFlightStopsTheClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPEP(t, pepOptions{})
	id := p.transfer(t, 50004)
	p.approve(t, p.request(t, id), time.Time{})
	tx, err := p.db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `UPDATE pep.callers SET revoked_at = now() WHERE name = 'alice-agent'`)
	require.NoError(t, err)
	advanced := make(chan error, 1)
	go func() { _, err := p.gate.Advance(ctx, id); advanced <- err }()
	for waiting := 0; waiting == 0; {
		select {
		case err := <-advanced:
			t.Fatalf("the claim did not wait for the revocation in flight (advance returned %v); the tool ran %d times", err, p.ledger(t, id))
		default:
		}
		require.NoError(t, p.db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting))
		time.Sleep(5 * time.Millisecond) // polling pg_stat_activity
	}
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-advanced)
	d := p.task(t, id)
	require.Equal(t, pep.DeniedNotExecuted, disposition(t, d))
	require.Contains(t, string(d.Result), "The caller is no longer authorized")
	require.Zero(t, p.ledger(t, id))
	require.Equal(t, []string{pep.AuditDenied}, p.trail(t, id), "no claim recorded")
}

// TestApprovalExpiresDuringRun: the approval's approved_until is checked at
// the claim, by the front-end's clock. If it passes after the PDP allowed
// the call but before the claim, the tool does not run (denied-not-executed).
// If it passes while the claimed tool runs, the run was authorized when it
// was claimed: it completes and its outcome is recorded (approved-executed),
// and the audit trail shows the claim before approved_until.
func TestApprovalExpiresDuringRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	started, release := make(chan struct{}), make(chan struct{})
	var hold atomic.Bool
	var once sync.Once
	p := newPEP(t, pepOptions{execTimeout: time.Hour,
		run: func(next func(context.Context, pep.Invocation) (pep.Output, error)) func(context.Context, pep.Invocation) (pep.Output, error) {
			return func(ctx context.Context, x pep.Invocation) (pep.Output, error) {
				if hold.Load() {
					once.Do(func() { close(started) })
					<-release
				}
				return next(ctx, x)
			}
		}})
	until := time.Now().Add(10 * time.Minute).Truncate(time.Second)

	t.Run("expired before the claim", func(t *testing.T) {
		id := p.transfer(t, 50004)
		p.approve(t, p.request(t, id), until)
		// The PDP re-evaluates by the backend's clock, before approved_until,
		// and allows; by the time the front-end claims, it has passed.
		p.onBackend(func(r *http.Request, body []byte) {
			if reevaluation(r, body) {
				p.offset.Store(int64(time.Until(until) + time.Minute))
			}
		})
		p.advance(t, id)
		p.onBackend(nil)
		p.offset.Store(0)
		d := p.task(t, id)
		require.Equal(t, pep.DeniedNotExecuted, disposition(t, d))
		require.Contains(t, string(d.Result), "The approval expired before the tool could run")
		require.Zero(t, p.ledger(t, id))
		require.Equal(t, []string{pep.AuditDenied}, p.trail(t, id))
	})

	t.Run("expires while the claimed tool runs", func(t *testing.T) {
		id := p.transfer(t, 50005)
		p.approve(t, p.request(t, id), until)
		hold.Store(true)
		done := make(chan error, 1)
		go func() { _, err := p.gate.Advance(ctx, id); done <- err }()
		wait(t, started, "the tool to start")
		p.offset.Store(int64(time.Until(until) + time.Minute)) // approved_until passes mid-run
		close(release)
		require.NoError(t, wait(t, done, "the run to end"))
		p.offset.Store(0)
		require.Equal(t, pep.ApprovedExecuted, disposition(t, p.task(t, id)))
		require.Equal(t, 1, p.ledger(t, id))
		recs, err := pep.AuditChain(ctx, p.db, id)
		require.NoError(t, err)
		require.Len(t, recs, 2)
		require.Equal(t, pep.AuditClaimed, recs[0].Kind)
		require.Equal(t, pep.AuditCompleted, recs[1].Kind)
		require.True(t, recs[0].At.Before(until), "claimed while the approval held")
		require.True(t, recs[1].At.After(until), "finished after it lapsed")
	})
	p.requireIntact(t)
}

// TestTTLExtendedWhenLaterDeadlineLearned: a task learns later deadlines
// while it is pending, and its ttlMs (what tasks/get promises about how long
// it stays readable) follows them: never shorter than the deadline plus
// result retention, never shrinking.
//
//   - The backend reports a later expires_at for the pending request than
//     the one the task was bound with (an ARS extending its deadline; ours
//     never does, so the test moves it in the backend's table): the task
//     keeps waiting past the first deadline, and the deadline never passes
//     the window --max-window allows.
//   - The request is approved but the grant is still provisioning
//     (re-evaluation answers retry): the task waits, pending, as long as the
//     approval lasts, which may be past the request's deadline.
func TestTTLExtendedWhenLaterDeadlineLearned(t *testing.T) {
	t.Parallel()
	const retention = 24 * time.Hour // the default
	t.Run("request deadline", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		p := newPEP(t, pepOptions{maxWindow: 48 * time.Hour})
		id := p.transfer(t, 50006)
		req := p.request(t, id)
		var first time.Time
		require.NoError(t, p.env.Pool.QueryRow(ctx, `SELECT expires_at FROM arap.requests WHERE id = $1`, req).Scan(&first))
		state := func() (deadline, windowEnd time.Time, ttl int64, created time.Time) {
			t.Helper()
			require.NoError(t, p.db.QueryRow(ctx, `SELECT a.deadline, a.window_end, t.ttl_ms, t.created_at FROM pep.approval_tasks a
				JOIN pep.tasks t ON t.id = a.task_id WHERE a.task_id = $1`, id).Scan(&deadline, &windowEnd, &ttl, &created))
			return
		}
		expect := func(deadline time.Time) {
			t.Helper()
			got, _, ttl, created := state()
			require.WithinDuration(t, deadline, got, time.Second, "deadline")
			require.Equal(t, tasks.TTLUntil(created, got.Add(retention)), ttl, "ttl_ms covers the deadline plus retention")
			d := p.get(t, id)
			require.Equal(t, tasks.Working, d.Status, "%s", d.StatusMessage)
			require.NotNil(t, d.TTLMs)
			require.Equal(t, ttl, *d.TTLMs, "tasks/get reports it")
		}
		setExpiry := func(at time.Time) {
			t.Helper()
			_, err := p.env.Pool.Exec(ctx, `UPDATE arap.requests SET expires_at = $2 WHERE id = $1`, req, at)
			require.NoError(t, err)
		}
		expect(first)
		_, windowEnd, _, _ := state()
		require.True(t, first.Before(windowEnd), "the policy's request_ttl (24h) is inside the window (48h)")

		// Six hours more, learned while pending; the front-end's clock is
		// then past the first deadline, and the task still waits.
		later := first.Add(6 * time.Hour)
		setExpiry(later)
		p.offset.Store(int64(time.Until(first) + time.Hour))
		p.advance(t, id)
		expect(later)

		// Far later than the window allows: up to the window's end only.
		setExpiry(time.Now().Add(100 * time.Hour))
		p.advance(t, id)
		expect(windowEnd)

		// Earlier again: nothing moves back.
		setExpiry(later)
		p.advance(t, id)
		expect(windowEnd)

		// Past the window's end the task ends, whatever the backend says.
		p.offset.Store(int64(time.Until(windowEnd) + time.Minute))
		p.advance(t, id)
		require.Equal(t, pep.DeniedNotExecuted, disposition(t, p.get(t, id)))
		require.Zero(t, p.ledger(t, id))
	})

	t.Run("approval awaiting its grant", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		// A request that may wait an hour; its approval lasts 20 hours, the
		// first of which the grant is provisioning.
		policy := strings.Replace(string(dev.SeedPolicy()), `    approval:
      quorum: 1
      groups: [treasury]   # bob, carol in the web UI
      kinds: [itsm]        # or an ITSM system through the decision API
      approved_for: 1h
`, `    request_ttl: 1h
    approval:
      quorum: 1
      groups: [treasury]
      kinds: [itsm]
      approved_for: 20h
      grant_delay: 1h
`, 1)
		require.Contains(t, policy, "grant_delay: 1h")
		p := newPEP(t, pepOptions{policy: []byte(policy)})
		id := p.transfer(t, 50015)
		req := p.request(t, id)
		var created time.Time
		var deadline time.Time
		require.NoError(t, p.db.QueryRow(ctx, `SELECT a.deadline, t.created_at FROM pep.approval_tasks a JOIN pep.tasks t ON t.id = a.task_id
			WHERE a.task_id = $1`, id).Scan(&deadline, &created))
		require.Equal(t, tasks.TTLUntil(created, deadline.Add(retention)), *p.get(t, id).TTLMs)

		p.approve(t, req, time.Time{})
		until := p.approval(t, req).ApprovedUntil
		require.True(t, until.After(deadline.Add(time.Hour)), "the approval outlasts the request's deadline")
		p.advance(t, id) // approved; re-evaluation: grant_pending, retry
		d := p.get(t, id)
		require.Equal(t, tasks.Working, d.Status, "%s", d.StatusMessage)
		require.Zero(t, p.ledger(t, id))
		require.Equal(t, tasks.TTLUntil(created, until.Add(retention)), *d.TTLMs, "readable while the approval may still be used, plus retention")
	})

	// The PDP answers "retry" (grant pending) while the approval is valid,
	// and the answer arrives once it is not: the gate does not end the task
	// on its own clock; it asks the PDP again, which sees the approval
	// expired and says what follows (a new request, or a denial).
	t.Run("retry answered after the approval expired", func(t *testing.T) {
		t.Parallel()
		policy := strings.Replace(string(dev.SeedPolicy()), `    approval:
      quorum: 1
      groups: [treasury]   # bob, carol in the web UI
      kinds: [itsm]        # or an ITSM system through the decision API
      approved_for: 1h
`, `    approval:
      quorum: 1
      groups: [treasury]
      kinds: [itsm]
      approved_for: 3h
      grant_delay: 2h
`, 1)
		require.Contains(t, policy, "grant_delay: 2h")
		p := newPEP(t, pepOptions{policy: []byte(policy)})
		id := p.transfer(t, 50016)
		req := p.request(t, id)
		p.approve(t, req, time.Time{})
		until := p.approval(t, req).ApprovedUntil
		var reevaluated atomic.Int32
		p.onBackend(func(r *http.Request, body []byte) {
			if reevaluation(r, body) {
				reevaluated.Add(1)
				p.offset.Store(int64(time.Until(until) + time.Minute))
			}
		})
		p.advance(t, id)
		p.onBackend(nil)
		p.offset.Store(0)
		require.EqualValues(t, 1, reevaluated.Load())
		d := p.get(t, id)
		require.Equal(t, tasks.Working, d.Status, "not ended on the gate's own clock: %s", d.StatusMessage)
		require.Zero(t, p.ledger(t, id))
	})
}

// TestExecuteTwiceOnStaleSnapshot: a runner acts on the task as it read it
// (phase pending); the claim compares and sets on the phase, so a snapshot
// that is stale because the task already ran, or was cancelled, cannot claim
// it again. Both orders of claim and cancel are forced: whichever comes
// first wins, the other changes nothing.
func TestExecuteTwiceOnStaleSnapshot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPEP(t, pepOptions{})
	approved := func(amount int) (string, *pep.Snapshot, string, time.Time) {
		t.Helper()
		id := p.transfer(t, amount)
		req := p.request(t, id)
		p.approve(t, req, time.Time{})
		ap := p.approval(t, req)
		s, err := p.gate.Snapshot(ctx, id)
		require.NoError(t, err)
		require.EqualValues(t, "pending", s.Phase)
		return id, s, ap.ID, ap.ApprovedUntil
	}

	t.Run("twice", func(t *testing.T) {
		id, s, apID, until := approved(50007)
		require.NoError(t, p.gate.ExecuteSnapshot(ctx, s, apID, until))
		require.Equal(t, 1, p.ledger(t, id))
		err := p.gate.ExecuteSnapshot(ctx, s, apID, until) // the same runner, or another with the same snapshot
		require.Equal(t, 1, p.ledger(t, id), "run once")
		require.NoError(t, err)
		require.Equal(t, pep.ApprovedExecuted, disposition(t, p.task(t, id)))
		require.Equal(t, []string{pep.AuditClaimed, pep.AuditCompleted}, p.trail(t, id))
	})
	t.Run("cancel first", func(t *testing.T) {
		id, s, apID, until := approved(50008)
		require.NoError(t, p.alice.Cancel(ctx, id))
		err := p.gate.ExecuteSnapshot(ctx, s, apID, until)
		require.Zero(t, p.ledger(t, id), "a cancelled task never runs")
		require.NoError(t, err)
		require.Equal(t, tasks.Cancelled, p.task(t, id).Status)
		require.Equal(t, []string{pep.AuditCancelled}, p.trail(t, id))
	})
	t.Run("claim first", func(t *testing.T) {
		id, s, apID, until := approved(50009)
		require.NoError(t, p.gate.ExecuteSnapshot(ctx, s, apID, until))
		_ = p.alice.Cancel(ctx, id) // refused or a no-op: either way it changes nothing
		require.Equal(t, 1, p.ledger(t, id))
		require.Equal(t, pep.ApprovedExecuted, disposition(t, p.task(t, id)))
		require.Equal(t, []string{pep.AuditClaimed, pep.AuditCompleted}, p.trail(t, id))
	})
	p.requireIntact(t)
}

// TestConcurrentAdvanceClaimsOnce: two runners (say the tracking job and a
// callback) advance the same approved task at once. Both are held at the
// re-evaluation until both have read the task pending and its approval, so
// both reach the claim with the same snapshot; one claims and runs, the
// other changes nothing.
func TestConcurrentAdvanceClaimsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPEP(t, pepOptions{})
	id := p.transfer(t, 50010)
	p.approve(t, p.request(t, id), time.Time{})
	arrived, proceed := make(chan struct{}, 2), make(chan struct{})
	p.onBackend(func(r *http.Request, body []byte) {
		if reevaluation(r, body) {
			arrived <- struct{}{}
			<-proceed
		}
	})
	errs := make(chan error, 2)
	for range 2 {
		go func() { _, err := p.gate.Advance(ctx, id); errs <- err }()
	}
	wait(t, arrived, "the first re-evaluation")
	wait(t, arrived, "the second re-evaluation")
	close(proceed)
	err1, err2 := wait(t, errs, "the first runner"), wait(t, errs, "the second runner")
	require.Equal(t, 1, p.ledger(t, id), "run once")
	require.NoError(t, err1)
	require.NoError(t, err2)
	require.Equal(t, pep.ApprovedExecuted, disposition(t, p.task(t, id)))
	require.Equal(t, []string{pep.AuditClaimed, pep.AuditCompleted}, p.trail(t, id))
	p.requireIntact(t)
}

// TestRetryStopsAtApprovalExpiry: a grant that provisions only after the
// approval ends is not waited for past approved_until: the next look is at
// approved_until at the latest, and it finds the approval expired, so the
// tool never runs on it (SEP-2848: retries "MUST stop once the approval
// expires").
func TestRetryStopsAtApprovalExpiry(t *testing.T) {
	t.Parallel()
	policy := strings.Replace(string(dev.SeedPolicy()), `      approved_for: 1h
`, `      approved_for: 1h
      grant_delay: 3h
`, 1)
	require.Contains(t, policy, "grant_delay: 3h")
	p := newPEP(t, pepOptions{policy: []byte(policy)})
	id := p.transfer(t, 50016)
	req := p.request(t, id)
	p.approve(t, req, time.Time{})
	until := p.approval(t, req).ApprovedUntil
	next, err := p.gate.Advance(context.Background(), id) // grant_pending, retry after about 3h
	require.NoError(t, err)
	require.False(t, next.After(until), "the next look (%s) is not after approved_until (%s)", next, until)
	require.Equal(t, tasks.Working, p.get(t, id).Status)

	// At approved_until the approval is expired: it is never used.
	p.offset.Store(int64(time.Until(until) + time.Second))
	p.advance(t, id)
	require.Zero(t, p.ledger(t, id))
}

// TestMaxWindowDenialIsNotOvertakenByItsCancel: past --max-window the task
// ends denied and its backend request is cancelled. The cancel makes the
// backend call back, and that wake-up reads the request as cancelled; the
// task must already be denied by then, or it would end cancelled instead
// (seen under load in e2e.TestMaxWindowEndsLongPendingTasks). The test runs
// the callback's Advance inside the cancel, as a fast callback would.
func TestMaxWindowDenialIsNotOvertakenByItsCancel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPEP(t, pepOptions{maxWindow: time.Hour})
	id := p.transfer(t, 50017)
	req := p.request(t, id)
	var inside atomic.Bool
	p.onBackend(func(r *http.Request, _ []byte) {
		if !strings.HasSuffix(r.URL.Path, "/cancel") || !inside.CompareAndSwap(false, true) {
			return
		}
		status, _ := p.backendAPI(t, dev.PEPToken, http.MethodPost, authzen.PathRequests+"/"+req+"/cancel", map[string]any{})
		require.Equal(t, http.StatusOK, status)
		_, err := p.gate.Advance(ctx, id) // the callback's wake-up
		require.NoError(t, err)
	})
	p.offset.Store(int64(2 * time.Hour))
	p.advance(t, id)
	require.True(t, inside.Load(), "the backend request was cancelled")
	require.Equal(t, pep.DeniedNotExecuted, disposition(t, p.get(t, id)))
	require.Zero(t, p.ledger(t, id))
}

// A claimed run is cut off early enough for its outcome to be written
// before the execution deadline: a run that took its whole time would
// otherwise finish just as the deadline passed and be reaped
// outcome-unknown although it was recorded a moment later.
func TestRunEndsBeforeTheExecutionDeadline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var runDeadline atomic.Pointer[time.Time]
	p := newPEP(t, pepOptions{execTimeout: 10 * time.Second,
		run: func(next func(context.Context, pep.Invocation) (pep.Output, error)) func(context.Context, pep.Invocation) (pep.Output, error) {
			return func(ctx context.Context, x pep.Invocation) (pep.Output, error) {
				if d, ok := ctx.Deadline(); ok {
					runDeadline.Store(&d)
				}
				return next(ctx, x)
			}
		}})
	id := p.transfer(t, 50031)
	p.approve(t, p.request(t, id), time.Time{})
	p.advance(t, id)
	require.Equal(t, pep.ApprovedExecuted, disposition(t, p.task(t, id)))
	recs, err := pep.AuditChain(ctx, p.db, id)
	require.NoError(t, err)
	var cd struct {
		ExecDeadline time.Time `json:"exec_deadline"`
	}
	require.NoError(t, json.Unmarshal(recs[0].Data, &cd))
	got := runDeadline.Load()
	require.NotNil(t, got, "the run has a deadline")
	require.False(t, got.Truncate(time.Microsecond).After(cd.ExecDeadline.Add(-2*time.Second)), // stored to the microsecond
		"the run's deadline %s leaves a fifth of the 10s execution timeout before the execution deadline %s", got, cd.ExecDeadline)
}
