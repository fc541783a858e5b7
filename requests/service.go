// Package requests runs the access-request lifecycle of the Access Request
// Service (ARAP sections 3.3 to 3.5): submission with idempotency and denial
// binding checks, status, cancellation, expiry, and the audit trail of each
// request.
//
// Every state change is one conditional UPDATE (... WHERE status = 'pending')
// in a transaction that also writes the audit event and enqueues the jobs the
// change implies, so a change and its consequences commit together, and a
// change that loses a race changes nothing and says so.
package requests

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/identity"
	"github.com/omcp/arap/internal/clean"
	"github.com/omcp/arap/internal/fault"
	"github.com/omcp/arap/signing"
)

// JobInserter enqueues River jobs inside a transaction.
type JobInserter interface {
	InsertTx(ctx context.Context, tx pgx.Tx, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error)
	InsertManyTx(ctx context.Context, tx pgx.Tx, params []river.InsertManyParams) ([]*rivertype.JobInsertResult, error)
}

// PDP is what the service needs of the policy decision point: the policy in
// force and its automated resolvers.
type PDP interface {
	Policy() *evaluation.Policy
	Resolve(ctx context.Context, rule *evaluation.Rule, req authzen.EvaluationRequest, now time.Time) (*evaluation.Resolver, error)
}

// Config configures a Service.
type Config struct {
	DB     *pgxpool.Pool
	Jobs   JobInserter
	Keys   *signing.Keys
	Policy PDP
	// Issuer is the PDP identifier binding tokens must carry as "iss".
	Issuer string
	// RequestsURL is this service's identifier (binding_token "aud") and the
	// base of status endpoints.
	RequestsURL string
	// ClockSkew is tolerated when checking a denial's freshness. Default 30s.
	ClockSkew time.Duration
	// Retention is how long a terminal request stays readable; after it the
	// status endpoint answers task_expired. Default 7 days.
	Retention time.Duration
	// IdempotencyRetention keeps keys at least this long after the request
	// ends. Default 24h (ARAP's minimum).
	IdempotencyRetention time.Duration
	// CheckCallback decides whether client clientID may register cb; without
	// it, submissions with a callback are refused.
	CheckCallback func(ctx context.Context, clientID string, cb *authzen.Callback) error
	// OnTerminal runs inside the transaction that ends requests, with every
	// request it ended (one, or an expiry sweep's batch): callback
	// deliveries are enqueued there, so they exist if and only if the change
	// does.
	OnTerminal func(ctx context.Context, tx pgx.Tx, ended []*Request) error
	// Events, if set, records the events people are told about (package
	// notify) inside the transaction of each change, so an event exists if
	// and only if its change does.
	Events Events
	// Passkeys verifies the assertions of signed decisions (package
	// passkeys); without it, rules requiring one cannot be decided by people.
	Passkeys PasskeyVerifier
	// People re-reads a person at their vote (package directory), inside
	// the vote's transaction; without it, a person's Voter is taken as
	// built.
	People People
	Now    func() time.Time
	Log    *slog.Logger
}

// People re-reads a person who votes, inside the vote's transaction tx,
// under a lock that disabling them or changing their groups waits for:
// their current groups and identities, and active false for a person
// disabled or gone (directory.Store.Deciding).
type People interface {
	Deciding(ctx context.Context, tx pgx.Tx, name string) (groups []string, ids []identity.ID, active bool, err error)
}

// Service is the Access Request Service.
type Service struct {
	cfg Config
}

// NewService checks cfg and returns a Service.
func NewService(cfg Config) (*Service, error) {
	if cfg.DB == nil || cfg.Jobs == nil || cfg.Keys == nil || cfg.Policy == nil || cfg.Issuer == "" || cfg.RequestsURL == "" {
		return nil, errors.New("requests: DB, Jobs, Keys, Policy, Issuer and RequestsURL are required")
	}
	if cfg.ClockSkew == 0 {
		cfg.ClockSkew = 30 * time.Second
	}
	if cfg.Retention == 0 {
		cfg.Retention = 7 * 24 * time.Hour
	}
	if cfg.IdempotencyRetention == 0 {
		cfg.IdempotencyRetention = 24 * time.Hour
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Service{cfg: cfg}, nil
}

func (s *Service) now() time.Time { return s.cfg.Now().UTC().Truncate(time.Microsecond) }

// StatusEndpoint is the URL of request id.
func (s *Service) StatusEndpoint(id string) string { return s.cfg.RequestsURL + "/" + id }

// Caller is the authenticated API client making a call.
type Caller struct {
	ID   string
	Name string
	// MayAssertActor says whether the client may claim an actor id.
	MayAssertActor func(id string) bool
}

func (c Caller) principal() string { return "client:" + c.Name }

// Get returns request id if caller may see it. A pending request whose
// deadline has passed is expired on the spot (the sweep runs once a second),
// so a reader never sees "pending" after expires_at.
func (s *Service) Get(ctx context.Context, caller Caller, id string) (*Request, error) {
	r, err := load(ctx, s.cfg.DB, id)
	if err != nil {
		return nil, err
	}
	if r.ClientID != caller.ID {
		// Not "forbidden": another client's request does not exist for you.
		return nil, errUnknownTask
	}
	if r.Status == Pending && !s.now().Before(r.ExpiresAt) {
		switch expired, err := s.Expire(ctx, id); {
		case err == nil:
			r = expired
		case ErrorCode(err) == authzen.ProblemInvalidTaskState:
			// Ended meanwhile (the sweep, or a decision just before the
			// deadline): read what it ended as.
			if r, err = load(ctx, s.cfg.DB, id); err != nil {
				return nil, err
			}
		default:
			return nil, err
		}
	}
	if r.TerminalAt != nil && s.now().After(r.TerminalAt.Add(s.cfg.Retention)) {
		return nil, refuse(authzen.ProblemTaskExpired, "this access request ended at %s and is past its retention period", r.TerminalAt.Format(time.RFC3339))
	}
	return r, nil
}

// Cancel cancels caller's pending request id.
func (s *Service) Cancel(ctx context.Context, caller Caller, id, reason, comment string) (*Request, error) {
	for _, t := range []string{reason, comment} {
		if err := clean.Text(t); err != nil {
			return nil, refuse(authzen.ProblemInvalidRequest, "the cancellation's reason or comment is refused: %v", err)
		}
	}
	r, err := s.Get(ctx, caller, id)
	if err != nil {
		return nil, err
	}
	if reason == "" {
		reason = ReasonCancelledByPEP
	}
	return s.Transition(ctx, r.ID, Change{
		To:     Cancelled,
		Reason: reason,
		Actor:  caller.principal(),
		Data:   map[string]any{"reason": reason, "comment": comment},
	})
}

// expiry is the change a request's deadline makes.
var expiry = Change{To: Expired, Reason: ReasonTimeout, Actor: "system"}

// Expire moves request id to expired if it is pending and due (a read after
// the deadline, ahead of the sweep); running it twice, or on two replicas,
// expires once.
func (s *Service) Expire(ctx context.Context, id string) (*Request, error) {
	return s.Transition(ctx, id, expiry)
}

// errNotDue is the code of an expiry attempted before the deadline.
const errNotDue = "not_due"

// Change describes a state transition.
type Change struct {
	To     Status
	Reason string
	Actor  string
	Result any            // stored as the task's result
	Data   map[string]any // extra audit detail
	// Within runs inside the transaction after the state has changed, for
	// work that must commit with it (votes, callbacks).
	Within func(ctx context.Context, tx pgx.Tx, r *Request) error
}

// Transition applies c to request id in one conditional UPDATE. Expiry
// applies only once the deadline has passed, every other change only before
// it, so a late decision loses to expiry. If the request is not pending (or
// the deadline check fails) nothing changes and the error says why.
func (s *Service) Transition(ctx context.Context, id string, c Change) (*Request, error) {
	var out *Request
	err := pgx.BeginFunc(ctx, s.cfg.DB, func(tx pgx.Tx) error {
		var err error
		out, err = s.TransitionTx(ctx, tx, id, c)
		return err
	})
	if err != nil {
		return nil, err
	}
	fault.Point("requests.after-transition-commit")
	return out, nil
}

// TransitionTx is Transition inside the caller's transaction.
func (s *Service) TransitionTx(ctx context.Context, tx pgx.Tx, id string, c Change) (*Request, error) {
	if !CanTransition(Pending, c.To) {
		return nil, fmt.Errorf("requests: %s is not a state a request can move to", c.To)
	}
	now := s.now()
	deadline := `expires_at > $5`
	if c.To == Expired {
		deadline = `expires_at <= $5`
	}
	r, err := scanRequest(tx.QueryRow(ctx, `UPDATE arap.requests
		SET status = $2, status_reason = $3, result = $4, terminal_at = $5, updated_at = $5
		WHERE id = $1 AND status = 'pending' AND `+deadline+`
		RETURNING `+requestColumns, id, c.To, c.Reason, c.Result, now))
	if errors.Is(err, pgx.ErrNoRows) {
		cur, lerr := load(ctx, tx, id)
		if lerr != nil {
			return nil, lerr
		}
		if cur.Status == Pending && c.To == Expired {
			return nil, &Error{Code: errNotDue, Detail: "the request's deadline has not passed", Current: Pending}
		}
		if cur.Status == Pending {
			return nil, &Error{Code: authzen.ProblemInvalidTaskState, Current: Expired,
				Detail: fmt.Sprintf("the access request expired at %s", cur.ExpiresAt.Format(time.RFC3339))}
		}
		return nil, &Error{Code: authzen.ProblemInvalidTaskState, Current: cur.Status,
			Detail: fmt.Sprintf("the access request is already %s", cur.Status)}
	}
	if err != nil {
		return nil, fmt.Errorf("requests: transition %s to %s: %w", id, c.To, err)
	}
	if err := audit.Append(ctx, tx, c.event(id, now)); err != nil {
		return nil, err
	}
	if c.Within != nil {
		if err := c.Within(ctx, tx, r); err != nil {
			return nil, err
		}
	}
	if err := s.endedTx(ctx, tx, c.To, []*Request{r}); err != nil {
		return nil, err
	}
	return r, nil
}

// event is the audit record of change c to request id.
func (c Change) event(id string, at time.Time) audit.Event {
	data := map[string]any{"from": string(Pending), "to": string(c.To), "reason": c.Reason}
	maps.Copy(data, c.Data)
	return audit.Event{Chain: id, Kind: "request." + string(c.To), Actor: c.Actor, At: at, Data: data}
}

// endedTx is what every end of requests commits with it, whether one
// (TransitionTx) or a sweep's batch (ExpireDue): the callbacks they
// subscribed to, and the count.
func (s *Service) endedTx(ctx context.Context, tx pgx.Tx, to Status, ended []*Request) error {
	if s.cfg.OnTerminal != nil && len(ended) > 0 {
		if err := s.cfg.OnTerminal(ctx, tx, ended); err != nil {
			return err
		}
	}
	events := make([]Event, len(ended))
	for i, r := range ended {
		events[i] = Event{Kind: EventEnded, RequestID: r.ID, Status: r.Status}
	}
	if err := s.recordTx(ctx, tx, events...); err != nil {
		return err
	}
	transitions.WithLabelValues(string(to)).Add(float64(len(ended)))
	return nil
}
