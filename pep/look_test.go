package pep_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/pep"
)

// TestTheSweepRunsAnApprovedTask: with no callback, a task is moved only by
// its looks: the binding schedules the first one (at the poll interval
// here: the stack has no callback URL), and a look after the approval runs
// the tool once; an ended task is not looked at again.
func TestTheSweepRunsAnApprovedTask(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPEP(t, pepOptions{})
	// The binding reads the front-end's clock (offset 0) between these two
	// readings: the first look is the poll interval after it.
	before := time.Now().Truncate(time.Microsecond) // the gate's resolution
	id := p.transfer(t, 50301)
	after := time.Now()
	poll := time.Duration(p.get(t, id).PollIntervalMs) * time.Millisecond
	require.NotZero(t, poll)
	var lookAt time.Time
	require.NoError(t, p.db.QueryRow(ctx, `SELECT look_at FROM pep.approval_tasks WHERE task_id = $1`, id).Scan(&lookAt))
	require.False(t, lookAt.Before(before.Add(poll)) || lookAt.After(after.Add(poll)),
		"the first look comes at the poll interval: %s, bound between %s and %s", lookAt, before, after)

	p.approve(t, p.request(t, id), time.Time{})
	p.offset.Store(int64(p.gate.LookLease())) // every look now due
	n, err := p.gate.LookDue(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 1, p.ledger(t, id), "the look ran the approved call")
	require.Equal(t, pep.ApprovedExecuted, disposition(t, p.get(t, id)))
	n, err = p.gate.LookDue(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "an ended task is not looked at")
	require.Equal(t, 1, p.ledger(t, id))
}
