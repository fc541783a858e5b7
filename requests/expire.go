package requests

import (
	"context"
	"fmt"
	"github.com/omcp/arap/internal/telemetry"
	"go.opentelemetry.io/otel/attribute"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/internal/fault"
)

// Expiry is a sweep, not a job per request: every second a periodic job
// expires what is due, a batch per transaction, on its own queue, because
// River's bookkeeping per job is what limits expiry when many requests fall
// due at once (docs/performance.md, "Expiry", has the measurements).
// Replicas share the work: each batch locks its rows with SKIP LOCKED. A
// request read after its deadline is also expired on read (Get), so the
// sweep's one-second grain is never visible.

// ExpireBatch is how many requests one sweep transaction expires.
const ExpireBatch = 200

// QueueMaintenance is the River queue of the sweep and the purge. Apart
// from the default queue, a backlog of callback deliveries (a sweep enqueues
// one per request that subscribed) cannot delay the sweep behind it.
const QueueMaintenance = "maintenance"

// MaintenanceWorkers is the maintenance queue's size on each replica. It
// sets the sweep's share of the machine against the callback deliveries it
// causes, which compete for the same cores (the value was chosen by
// measurement: docs/performance.md, "Expiry"). It also bounds the locks
// held at once: workers × ExpireBatch advisory locks per replica, well
// inside PostgreSQL's lock table (64 per connection by default).
const MaintenanceWorkers = 6

// ExpireDueArgs is the periodic sweep.
type ExpireDueArgs struct{}

// Kind implements river.JobArgs.
func (ExpireDueArgs) Kind() string { return "requests.expire_due" }

// InsertOpts puts the sweep on the maintenance queue.
func (ExpireDueArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{Queue: QueueMaintenance} }

// ExpireDueWorker runs the sweep until nothing is due.
type ExpireDueWorker struct {
	river.WorkerDefaults[ExpireDueArgs]
	Service *Service
}

// Work expires batches until a batch comes back short. A batch that fails is
// expired one request at a time instead, so one request that cannot be
// ended (a row that no longer reads, a callback that cannot be recorded)
// stops only itself, not every expiry behind it.
func (w *ExpireDueWorker) Work(ctx context.Context, _ *river.Job[ExpireDueArgs]) error {
	if err := drain(ctx, ExpireBatch, w.Service.ExpireDue); err != nil && ctx.Err() == nil {
		w.Service.cfg.Log.ErrorContext(ctx, "expiry batch failed; expiring one by one", "error", err)
		return w.Service.expireEach(ctx, ExpireBatch)
	}
	return nil
}

// drain runs step a batch at a time until a batch comes back short, ctx
// ends or a step fails: the shape of every sweep (expiry, escalation,
// reminders).
func drain(ctx context.Context, batch int, step func(context.Context, int) (int, error)) error {
	for ctx.Err() == nil {
		n, err := step(ctx, batch)
		if err != nil {
			return err
		}
		if n < batch {
			return nil
		}
	}
	return ctx.Err()
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
			SET status = $2, status_reason = $3, result = NULL, terminal_at = $1, updated_at = $1
			WHERE status = 'pending' AND expires_at <= $1 AND id IN (SELECT id FROM arap.requests
				WHERE status = 'pending' AND expires_at <= $1 ORDER BY expires_at LIMIT $4 FOR UPDATE SKIP LOCKED)
			RETURNING `+requestColumns, now, expiry.To, expiry.Reason, limit)
		if err != nil {
			return fmt.Errorf("requests: expire due: %w", err)
		}
		ended, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (*Request, error) { return scanRequest(row) })
		if err != nil {
			return fmt.Errorf("requests: expire due: %w", err)
		}
		events := make([]audit.Event, len(ended))
		for i, r := range ended {
			events[i] = expiry.event(r.ID, now)
		}
		if err := audit.AppendMany(ctx, tx, events); err != nil {
			return err
		}
		return s.endedTx(ctx, tx, expiry.To, ended)
	})
	if err != nil {
		return 0, err
	}
	if len(ended) > 0 {
		fault.Point("requests.after-expire-commit")
		// The sweep's runs are not traced unless they do something.
		_, span := telemetry.Working(ctx, "requests.expire_due", attribute.Int("expired", len(ended)))
		span.End()
		s.cfg.Log.InfoContext(ctx, "requests expired", "count", len(ended))
	}
	return len(ended), nil
}

// expireEach expires up to limit due requests one transaction each, logging
// the ones that fail and going on.
func (s *Service) expireEach(ctx context.Context, limit int) error {
	rows, err := s.cfg.DB.Query(ctx, `SELECT id FROM arap.requests WHERE status = 'pending' AND expires_at <= $1
		ORDER BY expires_at LIMIT $2`, s.now(), limit)
	if err != nil {
		return fmt.Errorf("requests: due requests: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("requests: due requests: %w", err)
	}
	for _, id := range ids {
		if _, err := s.Expire(ctx, id); err != nil && ErrorCode(err) == "" {
			s.cfg.Log.ErrorContext(ctx, "request could not be expired", "request_id", id, "error", err)
		}
	}
	return ctx.Err()
}

// expirySweep is the periodic job that runs ExpireDue.
func expirySweep() *river.PeriodicJob {
	return river.NewPeriodicJob(river.PeriodicInterval(time.Second), func() (river.JobArgs, *river.InsertOpts) {
		return ExpireDueArgs{}, nil
	}, &river.PeriodicJobOpts{RunOnStart: true})
}
