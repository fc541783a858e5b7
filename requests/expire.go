package requests

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/omcp/arap/audit"
)

// Expiry is a sweep, not a job per request: every second a periodic job
// expires what is due, a batch per transaction. A job per request cost
// River's bookkeeping once per request and topped out near 1,100 expiries a
// second on two cores; batches take 100,000 due requests in seconds.
// Replicas share the work: each batch locks its rows with SKIP LOCKED. A
// request read after its deadline is also expired on read (Status), so the
// sweep's one-second grain is never visible.

// ExpireBatch is how many requests one sweep transaction expires.
const ExpireBatch = 500

// ExpireDueArgs is the periodic sweep.
type ExpireDueArgs struct{}

// Kind implements river.JobArgs.
func (ExpireDueArgs) Kind() string { return "requests.expire_due" }

// ExpireDueWorker runs the sweep until nothing is due (or its time is up).
type ExpireDueWorker struct {
	river.WorkerDefaults[ExpireDueArgs]
	Service *Service
}

// Work expires batches until a batch comes back short.
func (w *ExpireDueWorker) Work(ctx context.Context, _ *river.Job[ExpireDueArgs]) error {
	for ctx.Err() == nil {
		n, err := w.Service.ExpireDue(ctx, ExpireBatch)
		if err != nil {
			return err
		}
		if n < ExpireBatch {
			return nil
		}
	}
	return nil
}

// ExpireDue expires up to limit pending requests whose deadline has passed,
// in one transaction: one conditional UPDATE (rows another transaction holds
// are skipped, not waited for), their audit events in one append, and the
// callbacks they subscribed to. It returns how many it expired.
func (s *Service) ExpireDue(ctx context.Context, limit int) (int, error) {
	now := s.now()
	var ended []*Request
	err := pgx.BeginFunc(ctx, s.cfg.DB, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `UPDATE arap.requests
			SET status = 'expired', status_reason = $2, result = NULL, terminal_at = $1, updated_at = $1
			WHERE id IN (SELECT id FROM arap.requests WHERE status = 'pending' AND expires_at <= $1
				ORDER BY expires_at LIMIT $3 FOR UPDATE SKIP LOCKED)
			RETURNING `+requestColumns, now, ReasonTimeout, limit)
		if err != nil {
			return fmt.Errorf("requests: expire due: %w", err)
		}
		ended, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (*Request, error) { return scanRequest(row) })
		if err != nil {
			return fmt.Errorf("requests: expire due: %w", err)
		}
		events := make([]audit.Event, len(ended))
		for i, r := range ended {
			events[i] = audit.Event{Chain: r.ID, Kind: "request." + string(Expired), Actor: "system", At: now,
				Data: map[string]any{"from": string(Pending), "to": string(Expired), "reason": ReasonTimeout}}
		}
		if err := audit.AppendMany(ctx, tx, events); err != nil {
			return err
		}
		if s.cfg.OnTerminal != nil {
			for _, r := range ended {
				if err := s.cfg.OnTerminal(ctx, tx, r); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	transitions.WithLabelValues(string(Expired)).Add(float64(len(ended)))
	if len(ended) > 0 {
		s.cfg.Log.Info("requests expired", "count", len(ended))
	}
	return len(ended), nil
}

// expirySweep is the periodic job that runs ExpireDue.
func expirySweep() *river.PeriodicJob {
	return river.NewPeriodicJob(river.PeriodicInterval(time.Second), func() (river.JobArgs, *river.InsertOpts) {
		return ExpireDueArgs{}, nil
	}, &river.PeriodicJobOpts{RunOnStart: true})
}
