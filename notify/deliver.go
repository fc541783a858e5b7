package notify

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/omcp/arap/internal/fault"
	"github.com/omcp/arap/requests"
)

// DeliverArgs is the job that sends one delivery.
type DeliverArgs struct {
	EventID   string `json:"event_id"`
	Recipient string `json:"recipient"`
	Channel   string `json:"channel"`
}

// Kind implements river.JobArgs.
func (DeliverArgs) Kind() string { return "notify.deliver" }

// InsertOpts makes one job per (event, recipient, channel), River's unique
// key matching the deliveries' primary key.
func (DeliverArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: Queue, UniqueOpts: river.UniqueOpts{ByArgs: true}}
}

// DeliverWorker runs DeliverArgs.
type DeliverWorker struct {
	river.WorkerDefaults[DeliverArgs]
	Service *Service
}

// Timeout leaves room for the send's own timeout.
func (w *DeliverWorker) Timeout(*river.Job[DeliverArgs]) time.Duration {
	return w.Service.cfg.SendTimeout + 30*time.Second
}

// Work sends the delivery; an error makes River retry it with backoff, and
// the last attempt's failure marks it failed.
func (w *DeliverWorker) Work(ctx context.Context, job *river.Job[DeliverArgs]) error {
	return w.Service.Deliver(ctx, job.Args, job.Attempt >= job.MaxAttempts)
}

// errBusy says another worker holds the delivery (it is being sent).
var errBusy = errors.New("notify: delivery is being sent by another worker")

// Deliver sends delivery a once, holding its row locked from the read to
// the mark, so that no two workers send it at once. last marks a failure
// final.
func (s *Service) Deliver(ctx context.Context, a DeliverArgs, last bool) error {
	ch, ok := s.channels[a.Channel]
	if !ok {
		return fmt.Errorf("notify: channel %q is not configured on this replica", a.Channel)
	}
	// The event and its request are read before the transaction (see
	// Fanout); the delivery's own row is what the transaction locks.
	e, _, err := loadEvent(ctx, s.cfg.DB, a.EventID, false)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // purged
	}
	if err != nil {
		return fmt.Errorf("notify: load event %s: %w", a.EventID, err)
	}
	r, err := s.cfg.Requests.Load(ctx, e.RequestID)
	if requests.ErrorCode(err) != "" {
		return nil // the request is gone, as Fanout treats it: nothing to tell
	}
	if err != nil {
		return err
	}
	var sendErr error
	err = pgx.BeginFunc(ctx, s.cfg.DB, func(tx pgx.Tx) error {
		var address, role, status string
		var attempts int
		err := tx.QueryRow(ctx, `SELECT address, role, status, attempts FROM arap.notification_deliveries
			WHERE event_id = $1 AND recipient = $2 AND channel = $3 FOR UPDATE SKIP LOCKED`, a.EventID, a.Recipient, a.Channel).
			Scan(&address, &role, &status, &attempts)
		if errors.Is(err, pgx.ErrNoRows) {
			var exists bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM arap.notification_deliveries
				WHERE event_id = $1 AND recipient = $2 AND channel = $3)`, a.EventID, a.Recipient, a.Channel).Scan(&exists); err != nil {
				return err
			}
			if exists {
				return errBusy
			}
			return nil // purged
		}
		if err != nil {
			return fmt.Errorf("notify: load delivery: %w", err)
		}
		if status != "pending" {
			return nil
		}
		var m Message
		if role == RoleWebhook {
			m = Message{ID: e.ID + "." + a.Recipient, Payload: s.payload(e, r)}
		} else {
			m = s.message(e, r, role)
			m.ID = e.ID + "." + a.Recipient // the same on a re-send: a receiver can drop the repeat
		}
		m.To = address
		sctx, cancel := context.WithTimeout(ctx, s.cfg.SendTimeout)
		var ref string
		if u, ok := ch.(Updater); ok {
			ref, sendErr = s.postOrUpdate(sctx, tx, u, e, a, m)
		} else {
			sendErr = ch.Send(sctx, m)
		}
		cancel()
		fault.Point("notify.after-send")
		now := s.cfg.Now()
		status, outcome, errText := "sent", OutcomeSent, ""
		if sendErr != nil {
			status, outcome, errText = "pending", OutcomeRetry, sendErr.Error()
			if last {
				status, outcome = "failed", OutcomeFailed
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE arap.notification_deliveries SET status = $4, attempts = attempts + 1,
			last_error = nullif($5, ''), updated_at = $6::timestamptz, sent_at = CASE WHEN $4 = 'sent' THEN $6::timestamptz END,
			ref = coalesce(nullif($7, ''), ref)
			WHERE event_id = $1 AND recipient = $2 AND channel = $3 AND status = 'pending'`,
			a.EventID, a.Recipient, a.Channel, status, errText, now, ref); err != nil {
			return fmt.Errorf("notify: record delivery: %w", err)
		}
		notifications.WithLabelValues(a.Channel, outcome).Inc()
		if sendErr != nil {
			s.cfg.Log.WarnContext(ctx, "notification not sent", "event_id", a.EventID, "request_id", e.RequestID, "channel", a.Channel,
				"recipient", a.Recipient, "final", last, "error", sendErr)
		}
		return nil
	})
	if errors.Is(err, errBusy) {
		return river.JobSnooze(5 * time.Second)
	}
	if err != nil {
		return err
	}
	if sendErr != nil && !last {
		return fmt.Errorf("notify: send %s to %s: %w", a.Channel, a.Recipient, sendErr)
	}
	return nil
}

// postOrUpdate sends m through an Updater: it updates the message an
// earlier delivery about the same request posted to the same recipient on
// the same channel, or posts one when there is none (the first event, or a
// recipient told only now, such as the requester of the outcome). It
// returns the message's reference.
func (s *Service) postOrUpdate(ctx context.Context, tx pgx.Tx, u Updater, e *event, a DeliverArgs, m Message) (string, error) {
	// One poster at a time per (request, recipient, channel): two events'
	// deliveries racing would otherwise both find no message and both post.
	// The lock lasts until the first one's reference is committed.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`,
		"notify "+e.RequestID+" "+a.Recipient+" "+a.Channel); err != nil {
		return "", fmt.Errorf("notify: lock the message: %w", err)
	}
	var ref string
	err := tx.QueryRow(ctx, `SELECT d.ref FROM arap.notification_deliveries d JOIN arap.notification_events e ON e.id = d.event_id
		WHERE e.request_id = $1 AND d.recipient = $2 AND d.channel = $3 AND d.ref IS NOT NULL
		ORDER BY d.created_at, e.created_at LIMIT 1`, e.RequestID, a.Recipient, a.Channel).Scan(&ref)
	if errors.Is(err, pgx.ErrNoRows) {
		return u.Post(ctx, m)
	}
	if err != nil {
		return "", fmt.Errorf("find the message to update: %w", err)
	}
	return ref, u.Update(ctx, ref, m)
}

var _ requests.Events = (*Service)(nil)
