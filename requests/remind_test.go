package requests_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/migrations"
	"github.com/omcp/arap/requests"
)

var (
	lena        = requests.UserVoter("lena", names("lena"), []string{"treasury-leads"})
	aliceLeader = requests.UserVoter("alice", names("alice", "alice@example.com"), []string{"treasury-leads"})
)

// replicas starts n River clients with f's workers and periodic jobs on
// f's database, as n backends would run them.
func (f *fixture) replicas(t *testing.T, n int) {
	ctx := context.Background()
	for range n {
		workers := river.NewWorkers()
		f.svc.AddWorkers(workers)
		c, err := river.NewClient(riverpgxv5.New(f.db), &river.Config{
			Schema: migrations.RiverSchema, Workers: workers,
			Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2},
				requests.QueueMaintenance: {MaxWorkers: requests.MaintenanceWorkers}},
			PeriodicJobs:      f.svc.PeriodicJobs(),
			FetchPollInterval: 100 * time.Millisecond,
		})
		require.NoError(t, err)
		require.NoError(t, c.Start(ctx))
		t.Cleanup(func() { _ = c.Stop(context.Background()) })
	}
}

// sweeps counts the reminder sweeps River has completed.
func sweeps(t *testing.T, f *fixture) int {
	return count(t, f, "river.river_job WHERE kind = 'requests.remind_due' AND state = 'completed'")
}

// nextSweeps waits until River has completed two more sweeps than now, so
// whatever a sweep would record after a change has been recorded (the
// first may have started before the change).
func nextSweeps(t *testing.T, f *fixture) {
	t.Helper()
	before := sweeps(t, f)
	require.Eventually(t, func() bool { return sweeps(t, f) >= before+2 }, 30*time.Second, 50*time.Millisecond)
}

// marks counts the committed events of kind for request id.
func marks(t *testing.T, f *fixture, id string, kind requests.EventKind) int {
	return count(t, f, fmt.Sprintf("public.event_marks WHERE request_id = '%s' AND kind = '%s'", id, kind))
}

// race runs fn on several goroutines at once, as replicas' sweeps would.
func race(t *testing.T, fn func() error) {
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = fn() }()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
}

// TestRemindersOncePerInterval: with remind_every 10m, two River clients
// (two replicas) and sweeps racing by hand on one database record one
// reminder per interval: none before the first interval, one after each,
// one (not a burst) after the sweeps missed several, and none once the
// request has ended or expired.
func TestRemindersOncePerInterval(t *testing.T) {
	f := setupWith(t, "testdata/remind.yaml")
	f.withEvents(&events{})
	ctx := context.Background()
	wire := map[string]any{"to": "acct-991", "amount": 50000}
	r := f.submitFor("alice", "wire_transfer", wire)
	f.replicas(t, 2)
	remind := func() error { _, err := f.svc.RemindDue(ctx, 10); return err }

	nextSweeps(t, f)
	require.Zero(t, marks(t, f, r.ID, requests.EventReminder), "no reminder before the first interval")

	for i := 1; i <= 2; i++ {
		f.clock.Advance(10*time.Minute + time.Second)
		race(t, remind)
		require.Eventually(t, func() bool { return marks(t, f, r.ID, requests.EventReminder) >= i }, 30*time.Second, 20*time.Millisecond)
		nextSweeps(t, f)
		race(t, remind)
		require.Equal(t, i, marks(t, f, r.ID, requests.EventReminder), "one reminder for interval %d", i)
	}

	// Three and a half intervals with no sweep: one reminder, then the next
	// at the following boundary (60m after creation), not three at once.
	f.clock.Advance(35 * time.Minute)
	race(t, remind)
	require.Equal(t, 3, marks(t, f, r.ID, requests.EventReminder))
	var next time.Time
	require.NoError(t, f.db.QueryRow(ctx, `SELECT next_reminder_at FROM arap.requests WHERE id = $1`, r.ID).Scan(&next))
	require.WithinDuration(t, r.CreatedAt.Add(60*time.Minute), next, time.Millisecond)

	// Ended: no reminder however long it would have waited.
	_, err := f.svc.Decide(ctx, bob, r.ID, requests.Decision{Approve: false})
	require.NoError(t, err)
	f.clock.Advance(30 * time.Minute)
	race(t, remind)
	nextSweeps(t, f)
	require.Equal(t, 3, marks(t, f, r.ID, requests.EventReminder), "no reminder after the request ended")

	// Expired (past its deadline, before the sweep ends it): none either.
	x := f.submitFor("alice", "wire_transfer", wire)
	f.clock.Advance(4*time.Hour + time.Minute)
	n, err := f.svc.RemindDue(ctx, 10)
	require.NoError(t, err)
	require.Zero(t, n)
	nextSweeps(t, f)
	require.Zero(t, marks(t, f, x.ID, requests.EventReminder), "no reminder after the deadline")
}

// TestEscalation: escalate_after 1h to treasury-leads. Before, lena (a
// lead) is not eligible and says why, and cannot vote; the sweep (two
// replicas, racing sweeps) escalates once, with one audit event and one
// escalated event; after, lena may approve, quorum still counts (2), and
// alice, the subject, in treasury-leads, still may not decide.
func TestEscalation(t *testing.T) {
	f := setupWith(t, "testdata/remind.yaml")
	f.withEvents(&events{})
	ctx := context.Background()
	r := f.submitFor("alice", "wire_transfer", map[string]any{"to": "acct-991", "amount": 50000})
	f.replicas(t, 2)

	nextSweeps(t, f)
	cur, err := f.svc.Load(ctx, r.ID)
	require.NoError(t, err)
	require.Nil(t, cur.EscalatedAt)
	want := fmt.Sprintf("user:lena may decide this request only once it escalates to group treasury-leads, 1h0m0s after it was made (%s)",
		r.CreatedAt.Add(time.Hour).UTC().Format(time.RFC3339))
	ok, why := requests.MayDecide(lena, cur, nil, f.clock.Now())
	require.False(t, ok)
	require.Equal(t, want, why)
	require.Equal(t, requests.ErrorCode(requests.Qualified(lena, cur)), "ineligible_approver")
	_, err = f.svc.Decide(ctx, lena, r.ID, requests.Decision{Approve: true})
	require.ErrorContains(t, err, want)
	require.Zero(t, count(t, f, "arap.votes"))
	list, _, err := f.svc.List(ctx, &lena, requests.ListOptions{})
	require.NoError(t, err)
	require.Empty(t, list, "not in lena's queue before it escalates")

	f.clock.Advance(time.Hour + time.Second)
	race(t, func() error { _, err := f.svc.EscalateDue(ctx, 10); return err })
	require.Eventually(t, func() bool { return marks(t, f, r.ID, requests.EventEscalated) >= 1 }, 30*time.Second, 20*time.Millisecond)
	nextSweeps(t, f)
	require.Equal(t, 1, marks(t, f, r.ID, requests.EventEscalated), "escalated once")
	require.Equal(t, 1, count(t, f, fmt.Sprintf("arap.audit_events WHERE chain = '%s' AND kind = 'request.escalated'", r.ID)))

	cur, err = f.svc.Load(ctx, r.ID)
	require.NoError(t, err)
	require.NotNil(t, cur.EscalatedAt)
	ok, why = requests.MayDecide(lena, cur, nil, f.clock.Now())
	require.True(t, ok, why)
	list, _, err = f.svc.List(ctx, &lena, requests.ListOptions{})
	require.NoError(t, err)
	require.Len(t, list, 1, "in lena's queue once escalated")

	_, err = f.svc.Decide(ctx, aliceLeader, r.ID, requests.Decision{Approve: true})
	require.ErrorContains(t, err, "cannot decide a request made on their behalf")
	out, err := f.svc.Decide(ctx, lena, r.ID, requests.Decision{Approve: true})
	require.NoError(t, err)
	require.Equal(t, requests.Pending, out.Status, "quorum 2 still applies")
	out, err = f.svc.Decide(ctx, bob, r.ID, requests.Decision{Approve: true})
	require.NoError(t, err)
	require.Equal(t, requests.Approved, out.Status)
}

// histogram reads the time-to-first-decision histogram's count and sum.
func histogram(t *testing.T) (uint64, float64) {
	mfs, err := prometheus.DefaultGatherer.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "arap_time_to_first_decision_seconds" {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	return 0, 0
}

// TestPendingGaugeAndFirstDecision: arap_requests_pending counts what
// waits (not what ended or passed its deadline);
// arap_time_to_first_decision_seconds observes the first vote only, with
// the time since creation.
func TestPendingGaugeAndFirstDecision(t *testing.T) {
	f := setupWith(t, "testdata/remind.yaml")
	ctx := context.Background()
	gauge := f.svc.PendingGauge(func(context.Context) bool { return true })
	wire := map[string]any{"to": "acct-991", "amount": 50000}
	require.Zero(t, testutil.ToFloat64(gauge))
	a := f.submitFor("alice", "wire_transfer", wire)
	b := f.submitFor("alice", "wire_transfer", wire)
	require.Equal(t, 2.0, testutil.ToFloat64(gauge))

	n0, sum0 := histogram(t)
	f.clock.Advance(90 * time.Second)
	_, err := f.svc.Decide(ctx, bob, a.ID, requests.Decision{Approve: true})
	require.NoError(t, err)
	n1, sum1 := histogram(t)
	require.Equal(t, n0+1, n1)
	require.InDelta(t, 90, sum1-sum0, 5, "seconds from creation to the first vote")
	require.Equal(t, 2.0, testutil.ToFloat64(gauge), "still pending: quorum 2")

	f.clock.Advance(time.Minute)
	out, err := f.svc.Decide(ctx, carol, a.ID, requests.Decision{Approve: true})
	require.NoError(t, err)
	require.Equal(t, requests.Approved, out.Status)
	n2, _ := histogram(t)
	require.Equal(t, n1, n2, "a second vote is not a first decision")
	require.Equal(t, 1.0, testutil.ToFloat64(gauge))

	f.clock.Advance(5 * time.Hour) // b is past its deadline
	require.Zero(t, testutil.ToFloat64(gauge))
	_, err = f.svc.Expire(ctx, b.ID)
	require.NoError(t, err)
	require.Zero(t, testutil.ToFloat64(gauge))
}
