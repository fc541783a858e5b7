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

	// Test hooks around Use (export_test.go): before its transaction, and
	// inside it once the approval is locked and marked used.
	beforeUse, whileUsing func()
}

var _ evaluation.Approvals = (*ApprovalStore)(nil)

const approvalColumns = `id, request_id, client_id, rule, binding_hash, binding_context_members, actor_hash, status, approved_at, approved_until,
	grant_ready_at, used_at, coalesce(used_by, '')`

func scanApproval(row pgx.Row) (*evaluation.ApprovalRecord, error) {
	var a evaluation.ApprovalRecord
	err := row.Scan(&a.ID, &a.RequestID, &a.ClientID, &a.Rule, &a.BindingHash, &a.BindingContextMembers, &a.ActorHash, &a.Status,
		&a.ApprovedAt, &a.ApprovedUntil, &a.GrantReadyAt, &a.UsedAt, &a.UsedBy)
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

// RecordEvaluation adds a re-evaluation that did not use the approval to
// the request's audit chain, so the trail runs from denial to request to
// approval to every evaluation that presented it.
func (s *ApprovalStore) RecordEvaluation(ctx context.Context, a *evaluation.ApprovalRecord, callerID, evalID string, decision bool, reason string) error {
	return pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		return audit.Append(ctx, tx, evaluated(a, callerID, evalID, decision, reason, s.Now()))
	})
}

func evaluated(a *evaluation.ApprovalRecord, callerID, evalID string, decision bool, reason string, at time.Time) audit.Event {
	return audit.Event{Chain: a.RequestID, Kind: "approval.evaluated", Actor: "client-id:" + callerID, At: at,
		Data: map[string]any{"approval_id": a.ID, "evaluation_id": evalID, "decision": decision, "reason": reason}}
}

// Use implements evaluation.Approvals: one conditional UPDATE takes the
// approval's row lock (the lock Revoke and a superseding approval take) and
// marks the use only if the approval is still active and unexpired at now;
// the evaluation's audit event commits with it.
func (s *ApprovalStore) Use(ctx context.Context, a *evaluation.ApprovalRecord, callerID, evalID string, now time.Time) error {
	if s.beforeUse != nil {
		s.beforeUse()
	}
	return pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE arap.approvals SET used_at = coalesce(used_at, $2), used_by = coalesce(used_by, $3)
			WHERE id = $1 AND status = 'active' AND approved_until > $2`, a.ID, now, evalID)
		if err != nil {
			return fmt.Errorf("requests: use approval %s: %w", a.ID, err)
		}
		if tag.RowsAffected() == 0 {
			return evaluation.ErrApprovalNotLive
		}
		if s.whileUsing != nil {
			s.whileUsing()
		}
		return audit.Append(ctx, tx, evaluated(a, callerID, evalID, true, "", s.Now()))
	})
}

// Revoke ends approval id (or the approval of request id) before its
// approved_until; every re-evaluation that presents it after answers
// approval_expired. An approval a re-evaluation has already used (allowed a
// call with) is not revoked: the call may be running, so the answer is
// approval_already_used, saying when and by which evaluation. Revocation
// and use take the approval's row lock (ApprovalStore.Use), so one of the
// two comes first. Only a voter eligible for the request, or the system,
// may revoke.
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
		if a.UsedAt != nil {
			return &Error{Code: authzen.ProblemApprovalAlreadyUsed, UsedAt: a.UsedAt, UsedBy: a.UsedBy,
				Detail: fmt.Sprintf("approval %s was used at %s by evaluation %s: the call it approved may have run, so it can no longer be revoked",
					a.ID, a.UsedAt.UTC().Format(time.RFC3339), a.UsedBy)}
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
