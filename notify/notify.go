package notify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/riverqueue/river"

	"github.com/omcp/arap/directory"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/internal/randid"
	"github.com/omcp/arap/internal/summary"
	"github.com/omcp/arap/requests"
)

// Message is one notification to one address.
type Message struct {
	To, Subject string
	// Text and HTML are the same message as plain text and as HTML.
	Text, HTML string
	// ID identifies the delivery, the same on every retry (a receiver's
	// idempotency key); Payload is the event as JSON (webhook.go), for
	// channels that speak to machines.
	ID      string
	Payload []byte

	// The parts of the message, for channels that lay it out themselves
	// (Slack): the same summary, event line and link as Text and HTML.
	Kind    requests.EventKind
	Lead    string
	Link    string
	Summary summary.Summary
	Notes   summary.Notes
	// Request is the request as the message was built; AskDecision says
	// the recipient is asked to decide it (a decider, while it is pending).
	Request     *requests.Request
	AskDecision bool
}

// Channel is a way to reach a person.
type Channel interface {
	// Name is the channel's name in deliveries and metrics ("email").
	Name() string
	// Address is where u is reached on this channel; empty when u cannot be.
	Address(u *directory.User) string
	// Send delivers m once.
	Send(ctx context.Context, m Message) error
}

// Updater is a Channel whose messages can be changed after they are sent
// (Slack): the first event about a request to a recipient posts a message,
// and later events about that request update it.
type Updater interface {
	// Post sends m and returns a reference to the message it posted.
	Post(ctx context.Context, m Message) (ref string, err error)
	// Update replaces the message ref with m.
	Update(ctx context.Context, ref string, m Message) error
}

// Requests is what notify reads of requests.
type Requests interface {
	Load(ctx context.Context, id string) (*requests.Request, error)
	Votes(ctx context.Context, id string) ([]requests.Vote, error)
}

// Directory is what notify reads of the directory.
type Directory interface {
	Users(ctx context.Context) ([]*directory.User, error)
	User(ctx context.Context, name string) (*directory.User, error)
}

// Config configures a Service.
type Config struct {
	DB        *pgxpool.Pool
	Jobs      requests.JobInserter
	Requests  Requests
	Directory Directory
	Channels  []Channel
	// PageURL is the link to request id's page in the approvers' UI.
	PageURL func(id string) string
	// SendTimeout bounds one send (default 30s).
	SendTimeout time.Duration
	Now         func() time.Time
	Log         *slog.Logger
}

// Service records events and delivers notifications.
type Service struct {
	cfg      Config
	channels map[string]Channel
}

// NewService checks cfg and returns a Service.
func NewService(cfg Config) (*Service, error) {
	if cfg.DB == nil || cfg.Jobs == nil || cfg.Requests == nil || cfg.Directory == nil || cfg.PageURL == nil {
		return nil, errors.New("notify: DB, Jobs, Requests, Directory and PageURL are required")
	}
	if len(cfg.Channels) == 0 {
		return nil, errors.New("notify: at least one channel is required")
	}
	if cfg.SendTimeout == 0 {
		cfg.SendTimeout = 30 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Service{cfg: cfg, channels: map[string]Channel{}}
	for _, c := range cfg.Channels {
		if _, dup := s.channels[c.Name()]; dup {
			return nil, fmt.Errorf("notify: channel %q configured twice", c.Name())
		}
		s.channels[c.Name()] = c
	}
	return s, nil
}

// Outcomes of a delivery attempt, the metric's outcome label.
const (
	OutcomeSent   = "sent"
	OutcomeRetry  = "retry"  // failed; River tries again
	OutcomeFailed = "failed" // failed for good: out of attempts
)

var notifications = promauto.NewCounterVec(prometheus.CounterOpts{
	Name: "arap_notifications_total", Help: "Notification delivery attempts, by channel and outcome (sent, retry, failed).",
}, []string{"channel", "outcome"})

// EventIDPrefix starts every event id.
const EventIDPrefix = "nev_"

// FanoutArgs is the job that resolves an event's recipients.
type FanoutArgs struct {
	EventID string `json:"event_id"`
}

// Kind implements river.JobArgs.
func (FanoutArgs) Kind() string { return "notify.fanout" }

// InsertOpts puts fan-outs on the notify queue. The dispatch enqueues each
// event's once; a second one would find the event fanned out and do
// nothing.
func (FanoutArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{Queue: Queue} }

// Queue is the River queue of notifications, and Workers its workers per
// replica: a burst of events (a sweep expiring thousands of requests) waits
// its turn there instead of taking the connections and workers that
// callbacks, resolvers and the expiry sweep need.
const (
	Queue   = "notify"
	Workers = 4
)

// QueueTx queues the outbox rows of events in b, a batch the change sends
// in its own transaction (it implements requests.Events). Nothing else is
// written there: the dispatch (DispatchPending) enqueues the fan-outs of
// committed events within about a second, so a change pays one INSERT for
// its notifications and no River insert.
func (s *Service) QueueTx(b *pgx.Batch, events ...requests.Event) {
	n := len(events)
	if n == 0 {
		return
	}
	ids, reqIDs, kinds, voters, decisions, statuses := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	for i, e := range events {
		ids[i] = randid.New(EventIDPrefix)
		reqIDs[i], kinds[i], voters[i], decisions[i], statuses[i] = e.RequestID, string(e.Kind), e.Voter, e.Decision, string(e.Status)
	}
	b.Queue(`INSERT INTO arap.notification_events (id, request_id, kind, voter, decision, status, created_at, dispatched_at)
		SELECT id, request_id, kind, voter, decision, status, $7, NULL
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) AS e(id, request_id, kind, voter, decision, status)`,
		ids, reqIDs, kinds, voters, decisions, statuses, s.cfg.Now()).Exec(func(pgconn.CommandTag) error { return nil })
}

// DispatchBatch is the most events one dispatch transaction takes.
const DispatchBatch = 1000

// DispatchPending enqueues the fan-outs of the events not yet dispatched,
// marking them dispatched in the same transaction, so each event gets one
// fan-out job however many replicas dispatch at once (SKIP LOCKED). An
// event that nobody can be told of (audience, from the rule's notify
// section stored with its request) gets no job: it is marked fanned out
// there and then. It returns how many events it dispatched.
func (s *Service) DispatchPending(ctx context.Context) (int, error) {
	total := 0
	for {
		n := 0
		err := pgx.BeginFunc(ctx, s.cfg.DB, func(tx pgx.Tx) error {
			// The request's notify section comes wrapped, so that a rule
			// without one ({"n": null}) differs from a purged request (NULL),
			// whose event the fan-out settles.
			rows, err := tx.Query(ctx, `SELECT e.id, (SELECT jsonb_build_object('n', r.approval_policy->'notify') FROM arap.requests r WHERE r.id = e.request_id)
				FROM arap.notification_events e WHERE e.dispatched_at IS NULL
				ORDER BY e.created_at LIMIT $1 FOR UPDATE OF e SKIP LOCKED`, DispatchBatch)
			if err != nil {
				return err
			}
			var ids, quiet []string
			var jobs []river.InsertManyParams
			for rows.Next() {
				var id string
				var raw []byte
				if err := rows.Scan(&id, &raw); err != nil {
					rows.Close()
					return err
				}
				ids = append(ids, id)
				// An event whose section does not decode gets its fan-out
				// job, which fails alone, rather than stopping the batch.
				var np struct {
					N *evaluation.NotifyPolicy `json:"n"`
				}
				if raw != nil && json.Unmarshal(raw, &np) == nil {
					if people, hooks := s.audience(np.N); !people && !hooks {
						quiet = append(quiet, id)
						continue
					}
				}
				jobs = append(jobs, river.InsertManyParams{Args: FanoutArgs{EventID: id}})
			}
			if err := rows.Err(); err != nil {
				return err
			}
			n = len(ids)
			if n == 0 {
				return nil
			}
			// One UPDATE of each event, which settles at once those nobody
			// can be told of: each UPDATE of an event writes a new row version
			// and its index entries.
			now := s.cfg.Now()
			if _, err := tx.Exec(ctx, `UPDATE arap.notification_events SET dispatched_at = $2,
				fanned_out_at = CASE WHEN id = ANY($3) AND fanned_out_at IS NULL THEN $2 ELSE fanned_out_at END
				WHERE id = ANY($1)`, ids, now, quiet); err != nil {
				return err
			}
			if len(jobs) > 0 {
				_, err = s.cfg.Jobs.InsertManyTx(ctx, tx, jobs)
			}
			return err
		})
		if err != nil {
			return total, fmt.Errorf("notify: dispatch: %w", err)
		}
		total += n
		if n < DispatchBatch {
			return total, nil
		}
	}
}

// DispatchInterval is how often each replica dispatches the pending
// events: the most a notification waits before its fan-out is enqueued.
const DispatchInterval = time.Second

// Dispatcher runs DispatchPending every DispatchInterval in this replica
// (a host.Service). Every replica runs it, not River's leader alone: a
// leader that was killed keeps its lease for a while, and during a rolling
// upgrade the leader may be a version without the dispatch. Replicas do not
// collide (SKIP LOCKED), and the dispatch waits behind no queue.
type Dispatcher struct {
	Service *Service
	stop    context.CancelFunc
	done    chan struct{}
}

// Start runs the dispatch loop until Stop.
func (d *Dispatcher) Start(context.Context) error {
	ctx, stop := context.WithCancel(context.Background())
	d.stop, d.done = stop, make(chan struct{})
	go func() {
		defer close(d.done)
		t := time.NewTicker(DispatchInterval)
		defer t.Stop()
		for {
			round, cancel := context.WithTimeout(ctx, time.Minute)
			if _, err := d.Service.DispatchPending(round); err != nil && ctx.Err() == nil {
				d.Service.cfg.Log.WarnContext(ctx, "notification dispatch failed; retried in a second", "error", err)
			}
			cancel()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return nil
}

// Stop ends the loop and waits for a dispatch in progress.
func (d *Dispatcher) Stop() {
	if d.stop != nil {
		d.stop()
		<-d.done
	}
}

// AddWorkers registers the fan-out and delivery workers.
func (s *Service) AddWorkers(w *river.Workers) {
	river.AddWorker(w, &FanoutWorker{Service: s})
	river.AddWorker(w, &DeliverWorker{Service: s})
}
