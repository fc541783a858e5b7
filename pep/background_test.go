package pep_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
)

// TestStopWaitsForWakeUps: the advance a callback wakes belongs to the gate.
// Stop ends the gate's context and returns only once every wake-up has
// returned: one that already claimed its run finishes it and records the
// outcome before Stop returns (the run is not cut off by the stop); one
// still reading the backend is cancelled, and the task is left for the
// tracking job, not executed.
func TestStopWaitsForWakeUps(t *testing.T) {
	t.Parallel()
	var p *stack
	running := make(chan struct{}, 1)
	p = newPEP(t, pepOptions{run: func(next func(context.Context, pep.Invocation) (pep.Output, error)) func(context.Context, pep.Invocation) (pep.Output, error) {
		return func(ctx context.Context, inv pep.Invocation) (pep.Output, error) {
			running <- struct{}{}
			<-p.gate.Stopping() // the run outlasts the start of Stop
			return next(ctx, inv)
		}
	}})
	id := p.transfer(t, 50002)
	req := p.request(t, id)
	p.approve(t, req, time.Time{})
	require.Equal(t, http.StatusNoContent, p.callback(t, id, req, "approved"))
	wait(t, running, "the woken task's run")

	stopped := make(chan struct{})
	go func() { p.gate.Stop(); close(stopped) }()
	wait(t, stopped, "Stop")
	// Read at once: Stop has waited for the wake-up to record its outcome.
	require.Equal(t, pep.ApprovedExecuted, disposition(t, p.task(t, id)))
	require.Equal(t, 1, p.ledger(t, id))
	require.Error(t, p.gate.Start(context.Background()), "a stopped gate starts nothing")
}

func TestStopCancelsAWakeUpBeforeTheClaim(t *testing.T) {
	t.Parallel()
	// A long ExecTimeout: a wake-up not under the gate's context would hold
	// Stop for longer than wait allows.
	p := newPEP(t, pepOptions{execTimeout: 10 * time.Minute})
	id := p.transfer(t, 50003)
	req := p.request(t, id)
	p.approve(t, req, time.Time{})
	reading := make(chan struct{}, 1)
	p.onBackend(func(r *http.Request, _ []byte) {
		if r.Method == http.MethodGet && r.URL.Path == authzen.PathRequests+"/"+req {
			reading <- struct{}{}
			<-r.Context().Done() // the status read hangs until it is cancelled
		}
	})
	require.Equal(t, http.StatusNoContent, p.callback(t, id, req, "approved"))
	wait(t, reading, "the woken task's status read")

	stopped := make(chan struct{})
	go func() { p.gate.Stop(); close(stopped) }()
	wait(t, stopped, "Stop")
	p.onBackend(nil)
	require.Equal(t, tasks.Working, p.task(t, id).Status, "left for the tracking job")
	require.Zero(t, p.ledger(t, id))
}
