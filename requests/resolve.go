package requests

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/omcp/arap/authzen"
)

// ResolveArgs runs a request's automated resolvers. It is enqueued with the
// request, again whenever an attribute changes, and it reschedules itself for
// the next opening or closing of a policy window, so a resolver waiting for a
// change window decides as soon as the window opens.
type ResolveArgs struct {
	RequestID string `json:"request_id"`
}

// Kind implements river.JobArgs.
func (ResolveArgs) Kind() string { return "requests.resolve" }

// ResolveWorker runs ResolveArgs.
type ResolveWorker struct {
	river.WorkerDefaults[ResolveArgs]
	Service *Service
}

// Work runs the resolvers once.
func (w *ResolveWorker) Work(ctx context.Context, job *river.Job[ResolveArgs]) error {
	next, err := w.Service.Resolve(ctx, job.Args.RequestID)
	if err != nil {
		return err
	}
	if !next.IsZero() {
		return river.JobSnooze(max(time.Until(next), time.Second))
	}
	return nil
}

// Resolve runs request id's automated resolvers under the current policy and
// attributes. If one decides, its vote is cast (with the same eligibility
// rules as anyone's). If none does, it returns when to try again (the next
// window change before the request's deadline), or zero.
func (s *Service) Resolve(ctx context.Context, id string) (time.Time, error) {
	r, err := load(ctx, s.cfg.DB, id)
	if err != nil {
		if ErrorCode(err) == authzen.ProblemUnknownTask {
			return time.Time{}, nil
		}
		return time.Time{}, err
	}
	if r.Status != Pending {
		return time.Time{}, nil
	}
	p := s.cfg.Policy.Policy()
	rule, ok := p.Rule(r.Rule)
	if !ok || len(rule.Resolvers) == 0 {
		return time.Time{}, nil
	}
	now := s.now()
	// Resolvers read only the context the rule declared: anything else the
	// requester added (an "approved_by": "CFO", say) was never asked for
	// nor checked, so it must not decide anything.
	declared, _ := r.SplitContext()
	res, err := s.cfg.Policy.Resolve(ctx, rule, authzen.EvaluationRequest{Subject: r.Subject, Resource: r.Resource, Action: r.Action, Context: declared}, now)
	if err != nil {
		// A resolver that cannot evaluate decides nothing; people still can.
		s.cfg.Log.WarnContext(ctx, "automated resolver failed", "request_id", id, "error", err)
		return time.Time{}, nil
	}
	if res == nil {
		if next := p.NextWindowChange(now); !next.IsZero() && next.Before(r.ExpiresAt) {
			return next, nil
		}
		return time.Time{}, nil
	}
	_, err = s.Decide(ctx, resolverVoter(rule.Name, res), id, Decision{Approve: res.Decision == "approve", Reason: res.Reason})
	if code := ErrorCode(err); code != "" {
		// Decided meanwhile, already voted, or not allowed: nothing to do.
		s.cfg.Log.InfoContext(ctx, "automated resolver vote not counted", "request_id", id, "resolver", res.Name, "why", err.Error())
		return time.Time{}, nil
	}
	if err == nil {
		s.cfg.Log.InfoContext(ctx, "automated resolver decided", "request_id", id, "resolver", res.Name, "decision", res.Decision)
	}
	return time.Time{}, err
}

// RecheckPendingTx enqueues a resolver run for every pending request whose
// rule has automated resolvers: their inputs (attributes) just changed. It
// needs no Service, so admin tools can call it in their own transaction.
func RecheckPendingTx(ctx context.Context, tx pgx.Tx, jobs JobInserter) error {
	rows, err := tx.Query(ctx, `SELECT id FROM arap.requests WHERE status = 'pending' AND (approval_policy->>'automated')::boolean`)
	if err != nil {
		return fmt.Errorf("requests: pending for recheck: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, id := range ids {
		if _, err := jobs.InsertTx(ctx, tx, ResolveArgs{RequestID: id}, nil); err != nil {
			return fmt.Errorf("requests: enqueue recheck: %w", err)
		}
	}
	return nil
}
