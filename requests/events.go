package requests

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Events records the events people are told about. It is the seam to the
// notifications (package notify), which implement it; requests knows
// nothing of recipients or channels.
type Events interface {
	// QueueTx queues the recording of events in b, a batch sent in the
	// transaction of the change they report (an error rolls it back).
	QueueTx(b *pgx.Batch, events ...Event)
}

// EventKind names what happened to a request.
type EventKind string

// The events for people.
const (
	EventCreated EventKind = "created" // a request waits for its deciders
	EventDecided EventKind = "decided" // someone voted (each vote)
	EventEnded   EventKind = "ended"   // the request reached a terminal state
	// EventReminder: the request still waits, remind_every after the last
	// reminder (or its creation); for the deciders who have not voted.
	EventReminder EventKind = "reminder"
	// EventEscalated: escalate_after passed and the escalate_to group's
	// people became deciders; for them.
	EventEscalated EventKind = "escalated"
)

// Event is one thing that happened to a request. It carries names only;
// whoever tells people reads the request through this package's API.
type Event struct {
	Kind      EventKind
	RequestID string
	// Voter and Decision are set on EventDecided ("user:bob", "approve").
	Voter    string
	Decision string
	// Status is set on EventEnded.
	Status Status
}

func (s *Service) recordTx(ctx context.Context, tx pgx.Tx, events ...Event) error {
	if s.cfg.Events == nil || len(events) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	s.cfg.Events.QueueTx(b, events...)
	return tx.SendBatch(ctx, b).Close()
}
