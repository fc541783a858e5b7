package requests

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/internal/randid"
)

// Request is an access request as stored.
type Request struct {
	ID                    string
	ClientID              string
	Status                Status
	StatusReason          string
	Rule                  string
	Subject               authzen.Object
	Resource              authzen.Object
	Action                authzen.Object
	Context               authzen.Object
	RequestedAccess       authzen.Object
	ClientInfo            *authzen.ClientInfo
	Denial                authzen.Denial
	EvaluationID          string
	BindingHash           string
	BindingContextMembers []string
	Display               map[string]any
	ExpiresAt             time.Time
	CreatedAt             time.Time
	UpdatedAt             time.Time
	TerminalAt            *time.Time
	Result                *authzen.Result
	// ApprovalPolicy is the rule's approval policy as it was at submission.
	ApprovalPolicy evaluation.ApprovalPolicy
	// Callback is the callback the submission registered, if any.
	Callback *authzen.Callback
	// EscalatedAt is when the request escalated (ApprovalPolicy.EscalateTo's
	// people became deciders); nil until then, and for rules without
	// escalation.
	EscalatedAt *time.Time
	// TraceParent is the trace context of the submission (migrations/arap
	// 0019); "" when it was not traced.
	TraceParent string
}

// SplitContext parts the submitted context into the members the rule
// declared (ApprovalPolicy.DeclaredContext, as it was at submission) and the
// rest: extra members the requester added that nobody asked for and nothing
// checked. Both were stated by the requester; only the declared ones were
// validated against the request schema or bound to the evaluation. Either
// result may be nil.
func (r *Request) SplitContext() (declared, extra authzen.Object) {
	for k, v := range r.Context {
		dst := &extra
		if slices.Contains(r.ApprovalPolicy.DeclaredContext, k) {
			dst = &declared
		}
		if *dst == nil {
			*dst = authzen.Object{}
		}
		(*dst)[k] = v
	}
	return declared, extra
}

const requestColumns = `id, client_id, status, coalesce(status_reason, ''), rule, subject, resource, action, context,
	requested_access, client_info, denial, evaluation_id, binding_hash, binding_context_members, display,
	expires_at, created_at, updated_at, terminal_at, result, approval_policy, callback, escalated_at, coalesce(trace_parent, '')`

func scanRequest(row pgx.Row) (*Request, error) {
	var r Request
	err := row.Scan(&r.ID, &r.ClientID, &r.Status, &r.StatusReason, &r.Rule, &r.Subject, &r.Resource, &r.Action, &r.Context,
		&r.RequestedAccess, &r.ClientInfo, &r.Denial, &r.EvaluationID, &r.BindingHash, &r.BindingContextMembers, &r.Display,
		&r.ExpiresAt, &r.CreatedAt, &r.UpdatedAt, &r.TerminalAt, &r.Result, &r.ApprovalPolicy, &r.Callback, &r.EscalatedAt, &r.TraceParent)
	if err != nil {
		return nil, err
	}
	return &r, nil
}

// Querier runs a query returning one row; pools and transactions both do.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Id prefixes of requests and approvals.
const (
	RequestIDPrefix  = "arq_"
	ApprovalIDPrefix = "apr_"
)

func load(ctx context.Context, q Querier, id string) (*Request, error) {
	if !randid.Valid(RequestIDPrefix, id) {
		return nil, errUnknownTask
	}
	r, err := scanRequest(q.QueryRow(ctx, `SELECT `+requestColumns+` FROM arap.requests WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, errUnknownTask
	}
	if err != nil {
		return nil, fmt.Errorf("requests: load %s: %w", id, err)
	}
	return r, nil
}

// Handle renders the request as an ARAP task response. statusEndpoint is the
// request's URL; links.cancel is offered only while the request is pending.
func (r *Request) Handle(statusEndpoint string) authzen.TaskResponse {
	exp := r.ExpiresAt
	t := authzen.Task{
		ID:             r.ID,
		Status:         string(r.Status),
		StatusEndpoint: statusEndpoint,
		ExpiresAt:      &exp,
	}
	if r.Display != nil || r.StatusReason != "" {
		t.Display = map[string]any{}
		for k, v := range r.Display {
			t.Display[k] = v
		}
		if r.StatusReason != "" {
			t.Display[authzen.DisplayStatusReason] = r.StatusReason
		}
	}
	if r.Status == Pending {
		t.Links = map[string]any{"cancel": statusEndpoint + "/cancel"}
	}
	return authzen.TaskResponse{Task: t, Result: r.Result}
}
