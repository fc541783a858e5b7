package notify

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/omcp/arap/directory"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/requests"
)

// Roles of recipients.
const (
	RoleDecider   = "decider"
	RoleRequester = "requester"
	RoleWebhook   = "webhook" // a webhook target, named in the rule's notify.webhooks
)

type event struct {
	ID, RequestID, Voter, Decision, Status string
	Kind                                   requests.EventKind
	CreatedAt                              time.Time
}

func loadEvent(ctx context.Context, q querier, id string, lock bool) (*event, bool, error) {
	var e event
	var fanned bool
	sql := `SELECT id, request_id, kind, voter, decision, status, created_at, fanned_out_at IS NOT NULL FROM arap.notification_events WHERE id = $1`
	if lock {
		sql += ` FOR UPDATE`
	}
	err := q.QueryRow(ctx, sql, id).Scan(&e.ID, &e.RequestID, &e.Kind, &e.Voter, &e.Decision, &e.Status, &e.CreatedAt, &fanned)
	if err != nil {
		return nil, false, err
	}
	return &e, fanned, nil
}

// querier is a pool or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// recipient is one person to tell, and why.
type recipient struct {
	user *directory.User
	role string
}

// recipients are whom event e about r is for:
//   - created: the deciders, while the request still waits;
//   - decided: the other deciders, while it still waits (a vote that ended
//     it is told by the ended event);
//   - ended: the requester and the deciders;
//   - reminder: the deciders who have not voted, while it still waits,
//     but not those an escalation less than an interval ago told already;
//   - escalated: the people the escalation made deciders (escalate_to's
//     members who were not deciders before) and have not voted.
//
// A decider is a directory user, not disabled, whom the approval policy
// names and who is not involved in the request (requests.Qualified: no
// self-approval), so nobody is asked to decide what they may not.
func (s *Service) recipients(ctx context.Context, e *event, r *requests.Request) ([]recipient, error) {
	if e.Kind != requests.EventEnded && r.Status != requests.Pending {
		return nil, nil
	}
	users, err := s.cfg.Directory.Users(ctx)
	if err != nil {
		return nil, err
	}
	var voted []string
	if e.Kind == requests.EventReminder || e.Kind == requests.EventEscalated {
		votes, err := s.cfg.Requests.Votes(ctx, r.ID)
		if err != nil {
			return nil, err
		}
		for _, vt := range votes {
			voted = append(voted, vt.Voter)
		}
	}
	unescalated := *r
	unescalated.EscalatedAt = nil
	var out []recipient
	for _, u := range users {
		if u.DisabledAt != nil {
			continue
		}
		v := requests.UserVoter(u.Name, u.Identities(), u.Groups)
		if requests.Qualified(v, r) != nil || (e.Kind == requests.EventDecided && v.ID == e.Voter) || slices.Contains(voted, v.ID) {
			continue
		}
		if e.Kind == requests.EventEscalated && requests.Qualified(v, &unescalated) == nil {
			continue // a decider already: told when the request was made
		}
		if e.Kind == requests.EventReminder && escalatedSince(r, e.CreatedAt) && requests.Qualified(v, &unescalated) != nil {
			continue // told "escalated to you" within this interval: one message, not two
		}
		out = append(out, recipient{user: u, role: RoleDecider})
	}
	if e.Kind == requests.EventEnded && r.Subject.Str("type") == "user" {
		u, err := s.cfg.Directory.User(ctx, r.Subject.Str("id"))
		switch {
		case errors.Is(err, directory.ErrNotFound):
		case err != nil:
			return nil, err
		case u.DisabledAt == nil:
			out = append(out, recipient{user: u, role: RoleRequester})
		}
	}
	return out, nil
}

// escalatedSince reports whether r was escalated less than one reminder
// interval before at: the people the escalation brought in were told then.
func escalatedSince(r *requests.Request, at time.Time) bool {
	return r.EscalatedAt != nil && at.Sub(*r.EscalatedAt) < r.ApprovalPolicy.RemindEvery
}

// audience says whom an event of a request whose rule's notify section is
// np can reach: people (a channel for people is configured and the rule
// uses it; without a notify section, every one), and webhook targets (the
// channel is configured and the rule names targets). With neither, nobody
// can be told, whatever the event.
func (s *Service) audience(np *evaluation.NotifyPolicy) (people, hooks bool) {
	for _, c := range s.cfg.Channels {
		people = people || (c.Name() != ChannelWebhook && np.Uses(c.Name()))
	}
	_, hooks = s.channels[ChannelWebhook]
	return people, hooks && np.Uses(ChannelWebhook) && len(np.Webhooks) > 0
}

// FanoutWorker runs FanoutArgs.
type FanoutWorker struct {
	river.WorkerDefaults[FanoutArgs]
	Service *Service
}

// Work resolves the event's recipients and writes one delivery per
// (recipient, channel) with its job, in one transaction on the locked
// event. Run twice (a retry after a crash, a duplicated job), it adds
// nothing: the event is marked fanned out, and the deliveries' key is
// (event, recipient, channel).
func (w *FanoutWorker) Work(ctx context.Context, job *river.Job[FanoutArgs]) error {
	return w.Service.Fanout(ctx, job.Args.EventID)
}

// Fanout is FanoutWorker's work. What it reads (the event, the request,
// the directory) it reads before its transaction: a worker holding a
// connection while it waits for a second one starves the pool when many
// run at once.
func (s *Service) Fanout(ctx context.Context, eventID string) error {
	e, fanned, err := loadEvent(ctx, s.cfg.DB, eventID, false)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // purged
	}
	if err != nil {
		return fmt.Errorf("notify: load event %s: %w", eventID, err)
	}
	if fanned {
		return nil
	}
	r, err := s.cfg.Requests.Load(ctx, e.RequestID)
	if requests.ErrorCode(err) != "" {
		return nil // the request is gone: nobody to tell about it
	}
	if err != nil {
		return err
	}
	np := r.ApprovalPolicy.Notify
	people, hooks := s.audience(np)
	if !people && !hooks {
		// The dispatch enqueues no fan-out for such an event; a job of an
		// older version may still come here.
		_, err := s.cfg.DB.Exec(ctx, `UPDATE arap.notification_events SET fanned_out_at = $2 WHERE id = $1 AND fanned_out_at IS NULL`, e.ID, s.cfg.Now())
		return err
	}
	var rcpts []recipient
	if people {
		if rcpts, err = s.recipients(ctx, e, r); err != nil {
			return err
		}
	}
	return pgx.BeginFunc(ctx, s.cfg.DB, func(tx pgx.Tx) error {
		if _, fanned, err := loadEvent(ctx, tx, eventID, true); errors.Is(err, pgx.ErrNoRows) || (err == nil && fanned) {
			return nil // purged, or fanned out meanwhile
		} else if err != nil {
			return fmt.Errorf("notify: load event %s: %w", eventID, err)
		}
		var names, channels, addresses, roles []string
		for _, rc := range rcpts {
			for _, c := range s.cfg.Channels {
				if !np.Uses(c.Name()) {
					continue
				}
				if a := c.Address(rc.user); a != "" {
					names, channels, addresses, roles = append(names, rc.user.Name), append(channels, c.Name()), append(addresses, a), append(roles, rc.role)
				}
			}
		}
		// Webhook targets are told of every event, whatever the request's
		// state by now: a ticket follows the request from start to end.
		if hooks {
			for _, t := range np.Webhooks {
				names, channels, addresses, roles = append(names, t), append(channels, ChannelWebhook), append(addresses, t), append(roles, RoleWebhook)
			}
		}
		now := s.cfg.Now()
		rows, err := tx.Query(ctx, `INSERT INTO arap.notification_deliveries (event_id, recipient, channel, address, role, created_at, updated_at)
			SELECT $1, recipient, channel, address, role, $6, $6
			FROM unnest($2::text[], $3::text[], $4::text[], $5::text[]) AS d(recipient, channel, address, role)
			ON CONFLICT DO NOTHING RETURNING recipient, channel`, e.ID, names, channels, addresses, roles, now)
		if err != nil {
			return fmt.Errorf("notify: record deliveries: %w", err)
		}
		var jobs []river.InsertManyParams
		for rows.Next() {
			a := DeliverArgs{EventID: e.ID}
			if err := rows.Scan(&a.Recipient, &a.Channel); err != nil {
				rows.Close()
				return err
			}
			jobs = append(jobs, river.InsertManyParams{Args: a})
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("notify: record deliveries: %w", err)
		}
		if len(jobs) > 0 {
			if _, err := s.cfg.Jobs.InsertManyTx(ctx, tx, jobs); err != nil {
				return fmt.Errorf("notify: enqueue deliveries: %w", err)
			}
		}
		_, err = tx.Exec(ctx, `UPDATE arap.notification_events SET fanned_out_at = $2 WHERE id = $1 AND fanned_out_at IS NULL`, e.ID, now)
		return err
	})
}
