package requests

import (
	"github.com/omcp/arap/internal/telemetry"

	"context"

	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/riverqueue/river"
)

var (
	submitted = promauto.NewCounter(prometheus.CounterOpts{
		Name: "arap_requests_submitted_total", Help: "Access requests created (replays not counted).",
	})
	transitions = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "arap_requests_transitions_total", Help: "Access request state changes, by new state.",
	}, []string{"to"})
	firstDecision = promauto.NewHistogram(prometheus.HistogramOpts{
		Name: "arap_time_to_first_decision_seconds", Help: "Time from an access request's creation to its first vote (any decider).",
		Buckets: []float64{10, 30, 60, 300, 900, 1800, 3600, 2 * 3600, 4 * 3600, 8 * 3600, 24 * 3600},
	})
)

// PendingGauge is a gauge of the requests waiting for a decision, read from
// the database at each scrape; only the replica for which leader is true
// reports it, so that summing over replicas counts it once.
func (s *Service) PendingGauge(leader func(context.Context) bool) prometheus.Collector {
	return telemetry.LeaderGauge(prometheus.GaugeOpts{
		Name: "arap_requests_pending", Help: "Access requests waiting for a decision, in the whole database (reported by the River leader replica only).",
	}, leader, func(ctx context.Context) (n int, err error) {
		// A request past its deadline is expired (on read, or by the next
		// sweep within a second): it no longer waits.
		err = s.cfg.DB.QueryRow(ctx, `SELECT count(*) FROM arap.requests WHERE status = 'pending' AND expires_at > $1`, s.now()).Scan(&n)
		return n, err
	})
}

// ExpireArgs expired one request at its deadline. Requests are now expired
// by the sweep (expire.go); the worker stays for jobs an earlier version
// queued, which it still handles correctly.
type ExpireArgs struct {
	RequestID string `json:"request_id"`
}

// Kind implements river.JobArgs.
func (ExpireArgs) Kind() string { return "requests.expire" }

// ExpireWorker runs ExpireArgs.
type ExpireWorker struct {
	river.WorkerDefaults[ExpireArgs]
	Service *Service
}

// Work expires the request, or does nothing if it has already ended.
func (w *ExpireWorker) Work(ctx context.Context, job *river.Job[ExpireArgs]) error {
	r, err := w.Service.Expire(ctx, job.Args.RequestID)
	switch code := ErrorCode(err); {
	case err == nil:
		w.Service.cfg.Log.InfoContext(ctx, "request expired", "request_id", r.ID)
		return nil
	case code == errNotDue:
		// Scheduled early (clock skew between hosts): try again at the deadline.
		cur, lerr := load(ctx, w.Service.cfg.DB, job.Args.RequestID)
		if lerr != nil {
			return lerr
		}
		return river.JobSnooze(max(time.Until(cur.ExpiresAt), time.Second))
	case code != "":
		return nil // already terminal, or gone: nothing to do
	default:
		return err
	}
}

// PurgeArgs was the periodic retention job, which deleted the idempotency
// keys of requests ended more than the idempotency retention ago and the
// spent jti values of expired tokens. Since migration 0022 both are columns
// of the request row: a key past its retention is reclaimed by the
// submission that reuses it (Submit), and a jti stays with its request.
// The worker stays for jobs an earlier version queued, and does nothing.
type PurgeArgs struct{}

// Kind implements river.JobArgs.
func (PurgeArgs) Kind() string { return "requests.purge" }

// InsertOpts puts the purge on the maintenance queue.
func (PurgeArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{Queue: QueueMaintenance} }

// PurgeWorker runs PurgeArgs: nothing is left to purge.
type PurgeWorker struct {
	river.WorkerDefaults[PurgeArgs]
	Service *Service
}

// Work does nothing.
func (w *PurgeWorker) Work(context.Context, *river.Job[PurgeArgs]) error { return nil }

// AddWorkers registers the package's job workers.
func (s *Service) AddWorkers(w *river.Workers) {
	river.AddWorker(w, &ExpireWorker{Service: s})
	river.AddWorker(w, &ExpireDueWorker{Service: s})
	river.AddWorker(w, &PurgeWorker{Service: s})
	river.AddWorker(w, &RemindDueWorker{Service: s})
	river.AddWorker(w, &ResolveWorker{Service: s})
}

// PeriodicJobs are the package's scheduled jobs.
func (s *Service) PeriodicJobs() []*river.PeriodicJob {
	return []*river.PeriodicJob{
		expirySweep(),
		remindSweep(),
	}
}
