package pep_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
)

// TestRunningClaimIsReapedOnlyAtItsDeadline (issue 35): a claimed task
// whose tool is still running may be looked at before its execution
// deadline (a look brought forward, a second Advance), and is left
// running: the run may still record its outcome. Only a look at the
// deadline itself, by the front-end's clock, ends it outcome-unknown; the
// run's late end then records nothing more, and nothing runs it again.
func TestRunningClaimIsReapedOnlyAtItsDeadline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	started, release := make(chan struct{}), make(chan struct{})
	// A long ExecTimeout: the held run's own deadline (on the real clock)
	// must not end it; the test moves only the front-end's clock.
	p := newPEP(t, pepOptions{execTimeout: time.Hour,
		run: func(next func(context.Context, pep.Invocation) (pep.Output, error)) func(context.Context, pep.Invocation) (pep.Output, error) {
			return func(ctx context.Context, x pep.Invocation) (pep.Output, error) {
				close(started)
				<-release
				return next(ctx, x)
			}
		}})
	id := p.transfer(t, 50601)
	p.approve(t, p.request(t, id), time.Time{})
	ran := make(chan error, 1)
	go func() { _, err := p.gate.Advance(ctx, id); ran <- err }()
	wait(t, started, "the claimed run to start")

	var phase string
	var deadline, lookAt time.Time
	read := func() {
		require.NoError(t, p.db.QueryRow(ctx, `SELECT phase, exec_deadline, look_at FROM pep.approval_tasks WHERE task_id = $1`, id).
			Scan(&phase, &deadline, &lookAt))
	}
	read()
	require.Equal(t, "claimed", phase)
	dl := deadline
	require.Equal(t, dl, lookAt, "the claim's look is at its execution deadline")
	stillRunning := func(what string) {
		t.Helper()
		read()
		require.Equal(t, "claimed", phase, what)
		require.Equal(t, dl, lookAt, "%s: its next look is at the deadline again", what)
		require.Equal(t, tasks.Working, p.task(t, id).Status, what)
		require.Equal(t, []string{pep.AuditClaimed}, p.trail(t, id), what)
	}

	// The last instant before the deadline, by the front-end's clock.
	before := dl.Add(-time.Microsecond) // the clock's resolution (Gate.now)
	p.frozen.Store(&before)
	n, err := p.gate.LookDue(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "the sweep does not take a claim before its deadline")
	stillRunning("not due")

	// Its look brought forward (as lookSoon does): the sweep takes it, and
	// the look leaves the running claim alone.
	_, err = p.db.Exec(ctx, `UPDATE pep.approval_tasks SET look_at = $2 WHERE task_id = $1`, id, before)
	require.NoError(t, err)
	n, err = p.gate.LookDue(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the look brought forward is taken")
	stillRunning("looked at early by the sweep")

	// An Advance of its own (as a wake-up would run) likewise.
	next, err := p.gate.Advance(ctx, id)
	require.NoError(t, err)
	require.True(t, next.Equal(dl), "the next look is at the execution deadline, not %s", next)
	stillRunning("advanced early")

	// At the deadline, the sweep's look ends it outcome-unknown.
	p.frozen.Store(&dl)
	n, err = p.gate.LookDue(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the claim's look at its execution deadline")
	require.Equal(t, pep.OutcomeUnknown, disposition(t, p.task(t, id)))
	require.Equal(t, []string{pep.AuditClaimed, pep.AuditOutcomeUnknown}, p.trail(t, id))

	close(release)
	require.NoError(t, wait(t, ran, "the late run to end"))
	require.Equal(t, 1, p.ledger(t, id), "it ran once, late")
	require.Equal(t, pep.OutcomeUnknown, disposition(t, p.task(t, id)), "its late end changes nothing")
	require.Equal(t, []string{pep.AuditClaimed, pep.AuditOutcomeUnknown}, p.trail(t, id))
	n, err = p.gate.LookDue(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "an ended task is not looked at")
	p.requireIntact(t)
}
