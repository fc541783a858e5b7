package evaluation

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/signing"
)

// ApprovalClaims are the claims of approval.state, a JWS the Access Request
// Service signs for the PDP. They carry what the PDP needs to check the
// approval's scope without asking anyone: the binding hash of the approved
// call and the context members it covers.
type ApprovalClaims struct {
	jwt.RegisteredClaims           // iss: the ARS; aud: the PDP; exp: approved_until
	ApprovalID            string   `json:"approval_id"`
	RequestID             string   `json:"request_id"`
	BindingHash           string   `json:"binding_hash"`
	BindingContextMembers []string `json:"binding_context_members"`
	// ActorHash binds the delegation chain of the approved call
	// (authzen.ActorHash): the approval covers it through that agent only.
	ActorHash string `json:"actor_hash"`
	// Rule is the policy rule the approval satisfies.
	Rule string `json:"rule"`
	// Scope is "exact": the approval covers exactly the bound subject,
	// resource, action and relevant context.
	Scope string `json:"scope"`
	// AuthorizedParty is the API client the approval was issued to.
	AuthorizedParty string `json:"azp"`
}

// ScopeExact is the only approval scope we issue.
const ScopeExact = "exact"

// Approval statuses.
const (
	ApprovalActive     = "active"
	ApprovalRevoked    = "revoked"
	ApprovalSuperseded = "superseded"
)

// ApprovalRecord is an approval as the Access Request Service keeps it.
type ApprovalRecord struct {
	ID          string
	RequestID   string
	ClientID    string
	Rule        string
	BindingHash string
	// BindingContextMembers is the context member set the approval covers;
	// scope is checked with this set, not the current rule's.
	BindingContextMembers []string
	// ActorHash is the approved call's delegation chain (authzen.ActorHash).
	ActorHash     string
	Status        string
	ApprovedAt    time.Time
	ApprovedUntil time.Time
	GrantReadyAt  time.Time
	// UsedAt is when a re-evaluation first allowed a call with the
	// approval, UsedBy that evaluation's id; nil and "" while unused.
	UsedAt *time.Time
	UsedBy string
}

// Approvals looks up approvals and records their use, for re-evaluation.
type Approvals interface {
	// Approval returns the approval with id, or nil if there is none.
	Approval(ctx context.Context, id string) (*ApprovalRecord, error)
	// RecordEvaluation notes a re-evaluation that presented the approval
	// and did not allow the call with it.
	RecordEvaluation(ctx context.Context, a *ApprovalRecord, callerID, evalID string, decision bool, reason string) error
	// Use records that evaluation evalID allows a call with approval a.
	// Under the lock a revocation takes, in one transaction, it checks that
	// the approval is still active and before its approved_until at now,
	// marks it used (its first use is kept) and records the evaluation; an
	// approval revoked, superseded or expired since it was read is
	// ErrApprovalNotLive, and nothing is recorded. Once used, an approval
	// can no longer be revoked: a revoker is never told "revoked" for an
	// approval a PEP may be about to run a call with.
	Use(ctx context.Context, a *ApprovalRecord, callerID, evalID string, now time.Time) error
}

// ErrApprovalNotLive is Approvals.Use's refusal of an approval that is no
// longer active, or past its approved_until, when its use is recorded.
var ErrApprovalNotLive = errors.New("evaluation: the approval is no longer live")

// reevaluate decides a request that presents context.approval (ARAP section
// 4). The approval is an input to a fresh decision under the current policy
// and attributes, never a standing grant:
//
//   - approval_unverifiable (none): state does not verify, or names another
//     approval, client or deployment, or the id is unknown;
//   - policy_denied (none): the current policy denies the call outright;
//   - allow: the current policy allows the call without approval;
//   - approval_expired (request): revoked, superseded or past approved_until;
//   - out_of_scope (request): valid, but for a different call or rule;
//   - grant_pending (retry): approved, not yet provisioned;
//   - allow, echoing the approval's id and approved_until.
//
// "request" answers carry a fresh access_request for the current call.
func (e *Engine) reevaluate(ctx context.Context, p *Policy, callerID string, req authzen.EvaluationRequest, raw any, evalID string, now time.Time) (Outcome, error) {
	deny := func(reason, next string) authzen.Decision {
		return authzen.Decision{Decision: false, Context: authzen.Object{
			authzen.CtxEvaluationID: evalID, authzen.CtxEvaluatedAt: now,
			authzen.CtxReason: reason, authzen.CtxNextAction: next}}
	}
	out := Outcome{Effect: EffectDeny, Reeval: true}
	rec, problem, err := e.verifyApproval(ctx, callerID, raw, now)
	if noVerdict(err) {
		// Not a verdict on the approval: the keys or the approval could not
		// be read (the database is down). An error, which the PEP retries,
		// not approval_unverifiable, which would end an approved call as
		// denied for a passing outage.
		return Outcome{}, err
	}
	if err != nil {
		// Anything else will not pass by waiting: fail closed.
		e.opts.Log.WarnContext(ctx, "approval could not be checked; denying", "error", err)
		problem = "approval.state could not be checked"
	}
	if problem != "" {
		e.opts.Log.InfoContext(ctx, "approval unverifiable", "reason", problem, "client", callerID)
		out.Decision, out.Reason = deny(authzen.ReasonApprovalUnverifiable, authzen.NextActionNone), authzen.ReasonApprovalUnverifiable
		out.Decision.Context["detail"] = problem
		return out, nil
	}
	record := func(o Outcome) (Outcome, error) {
		if err := e.opts.Approvals.RecordEvaluation(ctx, rec, callerID, evalID, o.Decision.Decision, o.Reason); err != nil {
			return Outcome{}, err
		}
		return o, nil
	}

	rule, _, err := e.match(ctx, p, req, now)
	if noVerdict(err) {
		return Outcome{}, err
	}
	if err != nil {
		e.opts.Log.WarnContext(ctx, "policy rule failed to evaluate; denying", "error", err)
		out.Decision, out.Reason = deny(authzen.ReasonPolicyDenied, authzen.NextActionNone), authzen.ReasonPolicyDenied
		return record(out)
	}
	if rule != nil {
		out.Rule = rule.Name
	}
	switch {
	case rule == nil || rule.Effect == EffectDeny:
		out.Decision, out.Reason = deny(authzen.ReasonPolicyDenied, authzen.NextActionNone), authzen.ReasonPolicyDenied
		return record(out)
	case rule.Effect == EffectAllow:
		out.Effect = EffectAllow
		out.Decision = authzen.Decision{Decision: true, Context: authzen.Object{authzen.CtxEvaluationID: evalID}}
		return record(out)
	}

	// A request rule matches: the approval must be live and cover this call.
	reRequest := func(reason string) (Outcome, error) {
		d := deny(reason, authzen.NextActionRequest)
		hint, err := e.requestableHint(ctx, callerID, rule, req, evalID, now)
		if err != nil {
			return Outcome{}, err
		}
		d.Context[authzen.CtxAccessRequest] = hint
		out.Decision, out.Reason = d, reason
		return record(out)
	}
	if rec.Status != ApprovalActive || !now.Before(rec.ApprovedUntil) {
		return reRequest(authzen.ReasonApprovalExpired)
	}
	hash, err := authzen.BindingHash(req.Subject, req.Resource, req.Action, req.Context, rec.BindingContextMembers)
	if err != nil {
		return Outcome{}, err
	}
	actors, err := authzen.ActorHash(req.Subject)
	if err != nil {
		return Outcome{}, err
	}
	if subtle.ConstantTimeCompare([]byte(hash), []byte(rec.BindingHash)) != 1 || rule.Name != rec.Rule ||
		rec.ActorHash == "" || subtle.ConstantTimeCompare([]byte(actors), []byte(rec.ActorHash)) != 1 {
		return reRequest(authzen.ReasonOutOfScope)
	}
	if now.Before(rec.GrantReadyAt) {
		d := deny(authzen.ReasonGrantPending, authzen.NextActionRetry)
		d.Context[authzen.CtxRetryAfter] = int(math.Ceil(rec.GrantReadyAt.Sub(now).Seconds()))
		out.Decision, out.Reason = d, authzen.ReasonGrantPending
		return record(out)
	}
	// The use, checked and recorded under the approval's lock: a
	// revocation that committed since the read above wins, one that comes
	// after finds the approval used and is refused.
	if err := e.opts.Approvals.Use(ctx, rec, callerID, evalID, now); errors.Is(err, ErrApprovalNotLive) {
		return reRequest(authzen.ReasonApprovalExpired)
	} else if err != nil {
		return Outcome{}, err
	}
	out.Effect = EffectAllow
	out.Decision = authzen.Decision{Decision: true, Context: authzen.Object{
		authzen.CtxEvaluationID: evalID,
		authzen.CtxApproval:     map[string]any{"id": rec.ID, "approved_until": rec.ApprovedUntil.UTC().Format(time.RFC3339)},
	}}
	return out, nil
}

// verifyApproval checks approval.state and finds the record; problem says
// what is wrong when it cannot be used at all, err that it could not be
// checked (keys or approvals unreadable), which is no verdict.
func (e *Engine) verifyApproval(ctx context.Context, callerID string, raw any, now time.Time) (*ApprovalRecord, string, error) {
	obj, ok := raw.(map[string]any)
	if !ok {
		return nil, "context.approval must be the approval object from the task result", nil
	}
	id, _ := obj["id"].(string)
	state, _ := obj["state"].(string)
	if id == "" || state == "" {
		return nil, "context.approval needs id and state, unchanged from the task result", nil
	}
	if e.opts.Approvals == nil {
		return nil, "this PDP cannot resolve approvals", nil
	}
	var c ApprovalClaims
	if err := e.opts.Keys.Verify(ctx, signing.TypeApproval, state, &c); err != nil {
		if errors.Is(err, signing.ErrMalformed) || errors.Is(err, signing.ErrBadSignature) || errors.Is(err, signing.ErrUnknownKey) ||
			errors.Is(err, signing.ErrKeyExpired) || errors.Is(err, signing.ErrWrongType) {
			return nil, fmt.Sprintf("approval.state does not verify: %v", err), nil
		}
		return nil, "", fmt.Errorf("evaluation: approval.state could not be checked: %w", err)
	}
	switch {
	case c.Issuer != e.opts.RequestsURL:
		return nil, "approval.state was not issued by this deployment's Access Request Service", nil
	case !slices.Contains([]string(c.Audience), e.opts.Issuer):
		return nil, "approval.state is not meant for this PDP", nil
	case c.ApprovalID != id:
		return nil, "approval.id does not match approval.state", nil
	case c.AuthorizedParty != callerID:
		return nil, "the approval was issued to a different client", nil
	case c.Scope != ScopeExact:
		return nil, "approval.state has an unknown scope", nil
	}
	rec, err := e.opts.Approvals.Approval(ctx, id)
	if err != nil {
		return nil, "", fmt.Errorf("evaluation: approval lookup: %w", err)
	}
	if rec == nil || rec.ClientID != callerID || rec.BindingHash != c.BindingHash || rec.ActorHash != c.ActorHash ||
		!slices.Equal(rec.BindingContextMembers, c.BindingContextMembers) {
		return nil, "unknown approval", nil
	}
	return rec, "", nil
}

// Resolve runs rule's automated resolvers on req and returns the first whose
// condition holds, or nil.
func (e *Engine) Resolve(ctx context.Context, rule *Rule, req authzen.EvaluationRequest, now time.Time) (*Resolver, error) {
	p := e.policy.Load()
	vars, err := e.activation(ctx, p, req, now)
	if err != nil {
		return nil, err
	}
	for _, r := range rule.Resolvers {
		val, _, err := r.program.Eval(vars)
		if err != nil {
			return nil, fmt.Errorf("resolver %q: %w", r.Name, err)
		}
		if b, _ := val.Value().(bool); b {
			return r, nil
		}
	}
	return nil, nil
}

// NextWindowChange is when any window of the policy next opens or closes
// after now: the next moment a resolver's answer can change with time.
func (p *Policy) NextWindowChange(now time.Time) time.Time {
	var next time.Time
	for _, w := range p.Windows {
		if t := w.NextChange(now); !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	return next
}
