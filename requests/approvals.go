package requests

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/internal/clean"
	"github.com/omcp/arap/internal/randid"
)

// ApprovalStore is the PDP's view of approvals: lookup by id and a record
// of each re-evaluation. It needs only the database, so the PDP can be built
// before the Service that needs the PDP.
type ApprovalStore struct {
	DB  *pgxpool.Pool
	Now func() time.Time
}

var _ evaluation.Approvals = (*ApprovalStore)(nil)

const approvalColumns = `id, request_id, client_id, rule, binding_hash, binding_context_members, actor_hash, status, approved_at, approved_until, grant_ready_at`

func scanApproval(row pgx.Row) (*evaluation.ApprovalRecord, error) {
	var a evaluation.ApprovalRecord
	err := row.Scan(&a.ID, &a.RequestID, &a.ClientID, &a.Rule, &a.BindingHash, &a.BindingContextMembers, &a.ActorHash, &a.Status,
		&a.ApprovedAt, &a.ApprovedUntil, &a.GrantReadyAt)
	return &a, err
}

// Approval returns approval id, or nil when there is none.
func (s *ApprovalStore) Approval(ctx context.Context, id string) (*evaluation.ApprovalRecord, error) {
	if !randid.Valid(ApprovalIDPrefix, id) {
		return nil, nil
	}
	a, err := scanApproval(s.DB.QueryRow(ctx, `SELECT `+approvalColumns+` FROM arap.approvals WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("requests: approval %s: %w", id, err)
	}
	return a, nil
}

// RecordEvaluation adds the re-evaluation to the request's audit chain, so
// the trail runs from denial to request to approval to every use of it.
func (s *ApprovalStore) RecordEvaluation(ctx context.Context, a *evaluation.ApprovalRecord, callerID string, decision bool, reason string) error {
	return pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		return audit.Append(ctx, tx, audit.Event{Chain: a.RequestID, Kind: "approval.evaluated", Actor: "client-id:" + callerID, At: s.Now(),
			Data: map[string]any{"approval_id": a.ID, "decision": decision, "reason": reason}})
	})
}

// Revoke ends approval id (or the approval of request id) before its
// approved_until; the next re-evaluation that presents it answers
// approval_expired. Only a voter eligible for the request, or the system, may.
func (s *Service) Revoke(ctx context.Context, v Voter, id, reason string) (*evaluation.ApprovalRecord, error) {
	var out *evaluation.ApprovalRecord
	if !randid.Valid(ApprovalIDPrefix, id) && !randid.Valid(RequestIDPrefix, id) {
		return nil, refuse(authzen.ProblemNotFound, "no approval with this id")
	}
	if err := clean.Text(reason); err != nil {
		return nil, refuse(authzen.ProblemInvalidRequest, "reason: %v", err)
	}
	err := pgx.BeginFunc(ctx, s.cfg.DB, func(tx pgx.Tx) error {
		a, err := scanApproval(tx.QueryRow(ctx, `SELECT `+approvalColumns+` FROM arap.approvals WHERE id = $1 OR request_id = $1 FOR UPDATE`, id))
		if errors.Is(err, pgx.ErrNoRows) {
			return refuse(authzen.ProblemNotFound, "no approval %s", id)
		}
		if err != nil {
			return err
		}
		if v.ID != "system" {
			r, err := load(ctx, tx, a.RequestID)
			if err != nil {
				return err
			}
			if !mayRevoke(v, r) {
				return refuse(authzen.ProblemIneligibleApprover, "%s is not among the deciders of this approval's request and cannot revoke it", v.ID)
			}
		}
		if a.Status != evaluation.ApprovalActive {
			return &Error{Code: authzen.ProblemInvalidTaskState, Detail: fmt.Sprintf("the approval is already %s", a.Status)}
		}
		now := s.now()
		if _, err := tx.Exec(ctx, `UPDATE arap.approvals SET status = 'revoked', revoked_at = $2, revoked_by = $3, revoke_reason = $4 WHERE id = $1`,
			a.ID, now, v.ID, reason); err != nil {
			return err
		}
		a.Status = evaluation.ApprovalRevoked
		out = a
		return audit.Append(ctx, tx, audit.Event{Chain: a.RequestID, Kind: "approval.revoked", Actor: v.ID, At: now,
			Data: map[string]any{"approval_id": a.ID, "reason": reason}})
	})
	return out, err
}

// mayRevoke: the deciders of a request may revoke its approval (but not
// someone the request was for, or its submitter).
func mayRevoke(v Voter, r *Request) bool {
	open := *r
	open.Status = Pending
	open.ExpiresAt = open.CreatedAt.AddDate(100, 0, 0)
	return Eligible(v, &open, open.CreatedAt) == nil
}
