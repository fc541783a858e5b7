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
)

// Reminders and escalation are a sweep, like expiry: every second a
// periodic job records what is due. Each is scheduled on the request at
// submission (next_reminder_at, escalate_at, from the rule's approval
// policy as stored with it) and moved by one conditional UPDATE on rows
// locked with SKIP LOCKED, in the transaction that records the event; so
// however many replicas sweep, a reminder is recorded once per interval
// and an escalation once, and none after the request has ended or expired.

// RemindBatch is how many requests one sweep transaction handles.
const RemindBatch = 200

// after is at+d, or nil when d is zero (the rule has no such schedule).
func after(at time.Time, d time.Duration) *time.Time {
	if d <= 0 {
		return nil
	}
	t := at.Add(d)
	return &t
}

// RemindDueArgs is the periodic reminder and escalation sweep.
type RemindDueArgs struct{}

// Kind implements river.JobArgs.
func (RemindDueArgs) Kind() string { return "requests.remind_due" }

// InsertOpts puts the sweep on the maintenance queue.
func (RemindDueArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{Queue: QueueMaintenance} }

// RemindDueWorker runs the sweep until nothing is due.
type RemindDueWorker struct {
	river.WorkerDefaults[RemindDueArgs]
	Service *Service
}

// Work escalates, then reminds, a batch at a time until a batch comes back
// short. Escalation goes first so that a reminder due at the same moment
// already counts the escalation group among its recipients.
func (w *RemindDueWorker) Work(ctx context.Context, _ *river.Job[RemindDueArgs]) error {
	if err := drain(ctx, RemindBatch, w.Service.EscalateDue); err != nil {
		return err
	}
	return drain(ctx, RemindBatch, w.Service.RemindDue)
}

// RemindDue records a reminder for up to limit pending requests whose
// reminder is due, and moves each one's next reminder to the first
// multiple of remind_every after now: one reminder per interval, and one
// only when the sweep missed several (replicas down), not a burst. It
// returns how many it recorded.
func (s *Service) RemindDue(ctx context.Context, limit int) (int, error) {
	now := s.now()
	var ids []string
	err := pgx.BeginFunc(ctx, s.cfg.DB, func(tx pgx.Tx) error {
		// remind_every is stored in the policy copy as nanoseconds.
		rows, err := tx.Query(ctx, `UPDATE arap.requests r
			SET next_reminder_at = r.next_reminder_at + every * (floor(extract(epoch FROM $1 - r.next_reminder_at) / extract(epoch FROM every)) + 1)
			FROM (SELECT id, make_interval(secs => (approval_policy->>'remind_every')::bigint / 1e9) AS every FROM arap.requests
				WHERE status = 'pending' AND next_reminder_at <= $1 AND expires_at > $1
				ORDER BY next_reminder_at LIMIT $2 FOR UPDATE SKIP LOCKED) due
			WHERE r.id = due.id AND r.status = 'pending' AND r.next_reminder_at <= $1
			RETURNING r.id`, now, limit)
		if err != nil {
			return fmt.Errorf("requests: remind due: %w", err)
		}
		if ids, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return fmt.Errorf("requests: remind due: %w", err)
		}
		events := make([]Event, len(ids))
		for i, id := range ids {
			events[i] = Event{Kind: EventReminder, RequestID: id}
		}
		return s.recordTx(ctx, tx, events...)
	})
	if err != nil {
		return 0, err
	}
	if len(ids) > 0 {
		_, span := telemetry.Working(ctx, "requests.remind_due", attribute.Int("reminded", len(ids)))
		span.End()
	}
	return len(ids), nil
}

// EscalateDue escalates up to limit pending requests whose escalate_at has
// passed: it sets escalated_at (from then on the escalation group's people
// are deciders: Qualified), appends the audit event and records the
// escalated event, in one transaction. It returns how many it escalated.
func (s *Service) EscalateDue(ctx context.Context, limit int) (int, error) {
	now := s.now()
	var ids []string
	err := pgx.BeginFunc(ctx, s.cfg.DB, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `UPDATE arap.requests SET escalated_at = $1, updated_at = $1
			WHERE status = 'pending' AND escalated_at IS NULL AND escalate_at <= $1 AND expires_at > $1 AND id IN (SELECT id FROM arap.requests
				WHERE status = 'pending' AND escalated_at IS NULL AND escalate_at <= $1 ORDER BY escalate_at LIMIT $2 FOR UPDATE SKIP LOCKED)
			RETURNING id, approval_policy->>'escalate_to'`, now, limit)
		if err != nil {
			return fmt.Errorf("requests: escalate due: %w", err)
		}
		var auditEvents []audit.Event
		var events []Event
		for rows.Next() {
			var id, group string
			if err := rows.Scan(&id, &group); err != nil {
				rows.Close()
				return fmt.Errorf("requests: escalate due: %w", err)
			}
			ids = append(ids, id)
			auditEvents = append(auditEvents, audit.Event{Chain: id, Kind: "request.escalated", Actor: "system", At: now,
				Data: map[string]any{"escalate_to": group}})
			events = append(events, Event{Kind: EventEscalated, RequestID: id})
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("requests: escalate due: %w", err)
		}
		if err := audit.AppendMany(ctx, tx, auditEvents); err != nil {
			return err
		}
		return s.recordTx(ctx, tx, events...)
	})
	if err != nil {
		return 0, err
	}
	if len(ids) > 0 {
		_, span := telemetry.Working(ctx, "requests.escalate_due", attribute.Int("escalated", len(ids)))
		span.End()
		s.cfg.Log.InfoContext(ctx, "requests escalated", "count", len(ids))
	}
	return len(ids), nil
}

// remindSweep is the periodic job that runs RemindDue and EscalateDue.
func remindSweep() *river.PeriodicJob {
	return river.NewPeriodicJob(river.PeriodicInterval(time.Second), func() (river.JobArgs, *river.InsertOpts) {
		return RemindDueArgs{}, nil
	}, &river.PeriodicJobOpts{RunOnStart: true})
}
