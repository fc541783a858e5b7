package chaos

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/pep"
)

// liveCount is how many tasks are not terminal, and requests and callback
// deliveries still pending (deliveries whose next retry, by the backend's
// schedule, comes after the settle deadline are not waited for: Check
// reports them as deferred).
func (s *system) liveCount(ctx context.Context, deadline time.Time) (live, pending int, err error) {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err = s.db.QueryRow(qctx, `SELECT (SELECT count(*) FROM pep.tasks WHERE status NOT IN ('completed','failed','cancelled')),
		(SELECT count(*) FROM arap.requests WHERE status = 'pending') + (SELECT count(*) FROM arap.deliveries d WHERE status = 'pending' AND NOT EXISTS (SELECT 1 FROM pep.webhook_ids w WHERE w.id = d.id AND w.handled)
			AND d.next_attempt_at < $1)`, deadline).Scan(&live, &pending)
	return
}

// snapshot reads the tables the checker judges, directly from PostgreSQL.
func (s *system) snapshot(ctx context.Context, h *History) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	h.Settle.At = time.Now()
	rows, err := s.db.Query(ctx, `SELECT t.id, t.status, t.status_message, left(COALESCE(t.result->'content'->0->>'text', t.error->>'message', ''), 200), a.tool, a.phase, COALESCE(a.disposition, ''), a.claimed_at, COALESCE(a.backend_id, ''), t.created_at, t.terminal_at
		FROM pep.tasks t JOIN pep.approval_tasks a ON a.task_id = t.id`)
	if err != nil {
		return fmt.Errorf("chaos: snapshot tasks: %w", err)
	}
	for rows.Next() {
		var t TaskRow
		if err := rows.Scan(&t.ID, &t.Status, &t.Message, &t.Reason, &t.Tool, &t.Phase, &t.Disposition, &t.ClaimedAt, &t.BackendID, &t.CreatedAt, &t.TerminalAt); err != nil {
			return err
		}
		h.Tasks = append(h.Tasks, t)
	}
	if rows.Err() != nil {
		return rows.Err()
	}
	rows, err = s.db.Query(ctx, `SELECT key, task_id, state, COALESCE(backend_id, '') FROM pep.intents`)
	if err != nil {
		return fmt.Errorf("chaos: snapshot intents: %w", err)
	}
	for rows.Next() {
		var i IntentRow
		if err := rows.Scan(&i.Key, &i.TaskID, &i.State, &i.BackendID); err != nil {
			return err
		}
		h.Intents = append(h.Intents, i)
	}
	if rows.Err() != nil {
		return rows.Err()
	}
	rows, err = s.db.Query(ctx, `SELECT r.id, r.status,
			COALESCE(r.resource->'properties'->'arguments'->>'call_id', r.resource->'properties'->'arguments'->>'to',
				r.resource->'properties'->'arguments'->>'customer_id', ''),
			r.callback IS NOT NULL,
			COALESCE((SELECT d.status || ' attempts=' || d.attempts || COALESCE(' next=' || d.next_attempt_at::text, '') || COALESCE(' last=' || left(d.last_error, 100), '') FROM arap.deliveries d WHERE d.request_id = r.id
				ORDER BY array_position(ARRAY['delivered','gone','pending','failed'], d.status) LIMIT 1), ''),
			(SELECT min(d.next_attempt_at) FROM arap.deliveries d WHERE d.request_id = r.id AND d.status = 'pending'),
			EXISTS (SELECT 1 FROM arap.deliveries d JOIN pep.webhook_ids w ON w.id = d.id AND w.handled WHERE d.request_id = r.id),
			COALESCE((SELECT min(seq) FROM arap.audit_events e WHERE e.chain = r.id AND e.kind = 'approval.revoked'), 0),
			COALESCE((SELECT min(seq) FROM arap.audit_events e WHERE e.chain = r.id AND e.kind = 'approval.evaluated' AND (e.data->>'decision')::boolean), 0),
			r.created_at,
			COALESCE((SELECT array_agg(e.seq || ' ' || e.kind || ' ' || e.actor || COALESCE(' decision=' || (e.data->>'decision'), '') || COALESCE(' reason=' || left(e.data->>'reason', 80), '') ORDER BY e.seq)
				FROM arap.audit_events e WHERE e.chain = r.id), '{}')
		FROM arap.requests r`)
	if err != nil {
		return fmt.Errorf("chaos: snapshot requests: %w", err)
	}
	for rows.Next() {
		var r RequestRow
		if err := rows.Scan(&r.ID, &r.Status, &r.CallID, &r.HasCallback, &r.Delivery, &r.NextAttempt, &r.Received, &r.RevokedSeq, &r.AllowedSeq, &r.CreatedAt, &r.Audit); err != nil {
			return err
		}
		r.CallID = strings.TrimPrefix(strings.TrimPrefix(r.CallID, "acct-"), "cust-")
		if d := strings.Fields(r.Delivery); len(d) > 0 {
			r.DeliveryNote, r.Delivery = r.Delivery, d[0]
		}
		h.Requests = append(h.Requests, r)
	}
	if rows.Err() != nil {
		return rows.Err()
	}
	rows, err = s.db.Query(ctx, `SELECT COALESCE(task_id, ''), tool, at, COALESCE(effect->>'to', '') FROM pep.ledger`)
	if err != nil {
		return fmt.Errorf("chaos: snapshot ledger: %w", err)
	}
	for rows.Next() {
		var l LedgerRow
		if err := rows.Scan(&l.TaskID, &l.Tool, &l.At, &l.CallID); err != nil {
			return err
		}
		l.CallID = strings.TrimPrefix(l.CallID, "acct-")
		h.Ledger = append(h.Ledger, l)
	}
	if rows.Err() != nil {
		return rows.Err()
	}
	rep, err := audit.Verify(ctx, s.db)
	if err != nil {
		return fmt.Errorf("chaos: verify the backend's audit: %w", err)
	}
	h.Audit.BackendChains, h.Audit.BackendEvents = rep.Chains, rep.Events
	for _, b := range rep.Breaks {
		h.Audit.BackendBreaks = append(h.Audit.BackendBreaks, fmt.Sprintf("%+v", b))
	}
	prep, err := pep.VerifyAudit(ctx, s.db)
	if err != nil {
		return fmt.Errorf("chaos: verify the front-end's audit: %w", err)
	}
	h.Audit.PEPChains, h.Audit.PEPEvents = prep.Chains, prep.Events
	for _, b := range prep.Breaks {
		h.Audit.PEPBreaks = append(h.Audit.PEPBreaks, fmt.Sprintf("%+v", b))
	}
	return nil
}
