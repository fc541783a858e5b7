package requests

import (
	"github.com/omcp/arap/internal/telemetry"
	"go.opentelemetry.io/otel/trace"

	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/jackc/pgx/v5"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/identity"
	"github.com/omcp/arap/internal/clean"
	"github.com/omcp/arap/internal/fault"
	"github.com/omcp/arap/internal/randid"
	"github.com/omcp/arap/passkeys"
	"github.com/omcp/arap/signing"
)

// Voter is whoever decides: a person (in the web UI), an API client (the
// decision API: an ITSM system, a supervising agent, a risk engine), or one
// of a rule's automated resolvers.
type Voter struct {
	// ID is the voter's stable name in votes and the audit trail:
	// "user:bob", "client:dev-itsm", "resolver:deploy_service.change_window".
	ID string
	// Kind is human, automation, agent or itsm.
	Kind string
	// Name is the user, client or resolver name.
	Name string
	// Groups the person belongs to.
	Groups []string
	// ClientID is set for API clients.
	ClientID string
	// Identities are who the voter is; nobody decides a request made for
	// them or through them, whichever way the request spells them.
	Identities []identity.ID
	// Resolver marks the rule's own automated resolver.
	Resolver bool
	// Channel is the way the decision came (evaluation.Channel*); empty for
	// the rule's own resolvers, which no channel restriction applies to.
	Channel string
	// Via is the API client a person's decision came through (channel
	// on_behalf); nil when the person decided themselves.
	Via *Via
}

// Via is the API client that recorded a person's decision for them.
type Via struct {
	ClientID string `json:"client_id"`
	Client   string `json:"client"`
	Kind     string `json:"kind"`
}

// UserVoter is a person deciding, known by the given identities (user name,
// e-mail address, and later the ids an identity provider gives).
func UserVoter(name string, identities []identity.ID, groups []string) Voter {
	return Voter{ID: "user:" + name, Kind: "human", Name: name, Groups: groups, Identities: append([]identity.ID{identity.Name(name)}, identities...),
		Channel: evaluation.ChannelWeb}
}

// OnBehalf is person (a UserVoter, built from the directory, never from the
// client's say-so) deciding through API client c: the vote is the person's,
// with the person's eligibility, separation of duties and quorum, and
// records the client as the channel it came through.
func OnBehalf(person Voter, clientID, clientName, clientKind string) Voter {
	person.Channel = evaluation.ChannelOnBehalf
	person.Via = &Via{ClientID: clientID, Client: clientName, Kind: clientKind}
	return person
}

// InSlack is person (a UserVoter, built from the directory entry whose
// e-mail address the Slack workspace confirmed) deciding through the Slack
// app: the vote is the person's, with the person's eligibility, separation
// of duties and quorum, through channel slack.
func InSlack(person Voter) Voter {
	person.Channel = evaluation.ChannelSlack
	return person
}

// ClientVoter is an API client deciding through the decision API. It is
// known by its name and id ("client:<name>" names it too).
func ClientVoter(id, name, kind string) Voter {
	return Voter{ID: "client:" + name, Kind: kind, Name: name, ClientID: id,
		Identities: []identity.ID{identity.Name(name), identity.Name(id)}, Channel: evaluation.ChannelAPI}
}

func resolverVoter(rule string, r *evaluation.Resolver) Voter {
	return Voter{ID: "resolver:" + rule + "." + r.Name, Kind: "automation", Name: rule + "." + r.Name, Resolver: true}
}

func (v Voter) human() bool { return v.Kind == "human" }

// Decision is a vote.
type Decision struct {
	Approve bool
	Reason  string
	// ApprovedUntil, optional, asks for a different approval lifetime; it may
	// not exceed what the approval policy allows. A signed approval carries
	// the window it signed (whole seconds).
	ApprovedUntil *time.Time
	// Assertion is the approver's passkey signature over this decision
	// (passkeys.Challenge of the request, its binding_hash, the decision and
	// ApprovedUntil), required on a rule with approval.require_passkey.
	Assertion *passkeys.Assertion
}

// PasskeyVerifier verifies a passkey assertion by user over challenge,
// inside the transaction that records the vote (and advances the key's
// signature counter there); a failure wraps passkeys.ErrAssertion.
type PasskeyVerifier interface {
	Verify(ctx context.Context, tx pgx.Tx, user string, challenge []byte, a *passkeys.Assertion) ([]byte, error)
}

// Vote is a recorded decision.
type Vote struct {
	Voter         string     `json:"voter"`
	Kind          string     `json:"kind"`
	Decision      string     `json:"decision"`
	Reason        string     `json:"reason,omitempty"`
	ApprovedUntil *time.Time `json:"approved_until,omitempty"`
	At            time.Time  `json:"at"`
	// Channel is the way the vote came (web, api, on_behalf, slack); empty for the
	// rule's own resolvers. Via is the client that recorded a person's vote.
	Channel string `json:"channel,omitempty"`
	Via     *Via   `json:"via,omitempty"`
}

// Decide records v's vote on request id. A deny by an eligible voter ends
// the request denied; approvals end it approved once the quorum (and the
// number of people required) is met. The vote, the state change, the audit
// events and the approval are one transaction on the locked request, so a
// concurrent cancel or expiry either happens before (and the vote is
// refused) or after (and finds the request no longer pending).
func (s *Service) Decide(ctx context.Context, v Voter, id string, d Decision) (*Request, error) {
	if !randid.Valid(RequestIDPrefix, id) {
		return nil, errUnknownTask
	}
	var out *Request
	var first bool
	var waited time.Duration
	err := pgx.BeginFunc(ctx, s.cfg.DB, func(tx pgx.Tx) error {
		r, err := scanRequest(tx.QueryRow(ctx, `SELECT `+requestColumns+` FROM arap.requests WHERE id = $1 FOR UPDATE`, id))
		if errors.Is(err, pgx.ErrNoRows) {
			return errUnknownTask
		}
		if err != nil {
			return fmt.Errorf("requests: lock %s: %w", id, err)
		}
		// The decision (web UI, decision API, Slack) links to the trace of
		// the submission it decides.
		if l, ok := telemetry.Link(r.TraceParent); ok {
			trace.SpanFromContext(ctx).AddLink(l)
		}
		now := s.now()
		if v, err = s.current(ctx, tx, v); err != nil {
			return err
		}
		if err := Eligible(v, r, now); err != nil {
			return err
		}
		waited = now.Sub(r.CreatedAt)
		p := r.ApprovalPolicy
		if d.Approve && !v.human() && !p.MachinesMayApprove() {
			return refuse(authzen.ProblemIneligibleApprover, "%s may deny this request but only a person may approve it", v.ID)
		}
		if d.ApprovedUntil != nil && d.Approve {
			if !d.ApprovedUntil.After(now) || d.ApprovedUntil.After(now.Add(p.MaxApprovedFor)) {
				return refuse(authzen.ProblemInvalidRequest, "approved_until must be in the future and at most %s from now (%s)",
					p.MaxApprovedFor, now.Add(p.MaxApprovedFor).UTC().Format(time.RFC3339))
			}
		}
		if len(d.Reason) > 2000 {
			return refuse(authzen.ProblemInvalidRequest, "reason is longer than 2000 characters")
		}
		if err := clean.Text(d.Reason); err != nil {
			return refuse(authzen.ProblemInvalidRequest, "reason: %v", err)
		}
		decision := evaluation.DecisionDeny
		if d.Approve {
			decision = evaluation.DecisionApprove
		}
		var until *time.Time
		if d.Approve {
			until = d.ApprovedUntil
		}
		var signed *passkeys.Assertion
		if p.RequirePasskey && !v.Resolver {
			if signed, err = s.checkSignature(ctx, tx, v, r, decision, until, d.Assertion); err != nil {
				return err
			}
		}
		var via Via
		if v.Via != nil {
			via = *v.Via
		}
		tag, err := tx.Exec(ctx, `INSERT INTO arap.votes (request_id, voter, voter_kind, decision, reason, approved_until, at,
			channel, via_client_id, via_client_name, via_client_kind)
			VALUES ($1, $2, $3, $4, $5, $6, $7, nullif($8, ''), nullif($9, ''), nullif($10, ''), nullif($11, '')) ON CONFLICT DO NOTHING`,
			id, v.ID, v.Kind, decision, d.Reason, until, now, v.Channel, via.ClientID, via.Client, via.Kind)
		if err != nil {
			return fmt.Errorf("requests: record vote: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return refuse(authzen.ProblemAlreadyDecided, "%s has already decided this request; one vote per approver", v.ID)
		}
		// The first vote (the request is locked, so votes come one by one).
		if err := tx.QueryRow(ctx, `SELECT count(*) = 1 FROM arap.votes WHERE request_id = $1`, id).Scan(&first); err != nil {
			return fmt.Errorf("requests: count votes: %w", err)
		}
		data := map[string]any{"voter_kind": v.Kind, "reason": d.Reason, "approved_until": until}
		if v.Channel != "" {
			data["channel"] = v.Channel
		}
		if signed != nil {
			data["assertion"] = signed
		}
		if v.Via != nil {
			// Both who decided (Actor, the person) and who carried it.
			data["via_client_id"], data["via_client"], data["via_client_kind"] = v.Via.ClientID, v.Via.Client, v.Via.Kind
		}
		if err := audit.Append(ctx, tx, audit.Event{Chain: id, Kind: "vote." + decision, Actor: v.ID, At: now, Data: data}); err != nil {
			return err
		}
		if err := s.recordTx(ctx, tx, Event{Kind: EventDecided, RequestID: id, Voter: v.ID, Decision: decision}); err != nil {
			return err
		}
		if !d.Approve {
			reason := ReasonDeniedByMachine
			if v.human() {
				reason = ReasonDeniedByUser
			}
			out, err = s.TransitionTx(ctx, tx, id, Change{To: Denied, Reason: reason, Actor: v.ID,
				Data: map[string]any{"voter_kind": v.Kind, "decision_reason": d.Reason}})
			return err
		}
		votes, err := votesTx(ctx, tx, id)
		if err != nil {
			return err
		}
		approvals, humans := 0, 0
		for _, vt := range votes {
			if vt.Decision == evaluation.DecisionApprove {
				approvals++
				if vt.Kind == "human" {
					humans++
				}
			}
		}
		if approvals < p.Quorum || humans < p.RequireHumans {
			out = r // still pending: more approvals needed
			return nil
		}
		out, err = s.approveTx(ctx, tx, r, votes, v.ID, now)
		return err
	})
	if err != nil {
		return nil, err
	}
	if first {
		firstDecision.Observe(waited.Seconds())
	}
	fault.Point("requests.after-decision-commit")
	return out, nil
}

// current is person v as the directory has them now, read under a lock
// held until the vote commits (Config.People): a person disabled before
// the vote may not vote, and their groups are today's, not their
// session's or their Slack click's. Others are as given.
func (s *Service) current(ctx context.Context, tx pgx.Tx, v Voter) (Voter, error) {
	if !v.human() || v.Resolver || s.cfg.People == nil {
		return v, nil
	}
	groups, ids, active, err := s.cfg.People.Deciding(ctx, tx, v.Name)
	if err != nil {
		return v, err
	}
	if !active {
		return v, refuse(authzen.ProblemIneligibleApprover, "%s is disabled or no longer in the directory and may not decide", v.ID)
	}
	v.Groups = groups
	// For separation of duties, every way they are known, then or now.
	v.Identities = append(slices.Clone(v.Identities), ids...)
	return v, nil
}

// checkSignature verifies a's signature of this very vote: the challenge
// is recomputed from the locked request's own id and binding_hash and the
// decision and window about to be recorded, so an assertion made for
// another request, call, decision or window does not verify.
func (s *Service) checkSignature(ctx context.Context, tx pgx.Tx, v Voter, r *Request, decision string, until *time.Time, a *passkeys.Assertion) (*passkeys.Assertion, error) {
	if v.Channel != evaluation.ChannelWeb || !v.human() {
		// Eligible refused these already; kept so the rule holds here alone.
		return nil, refuse(authzen.ProblemSignatureRequired, "rule %s requires a decision signed with the approver's passkey in the web UI", r.Rule)
	}
	if a == nil {
		return nil, refuse(authzen.ProblemSignatureRequired, "rule %s requires a decision signed with your passkey, and this one is not signed", r.Rule)
	}
	if s.cfg.Passkeys == nil {
		return nil, refuse(authzen.ProblemSignatureRequired, "rule %s requires a decision signed with a passkey, and passkeys are not available on this server", r.Rule)
	}
	if decision == evaluation.DecisionApprove && (until == nil || !until.Equal(until.Truncate(time.Second))) {
		return nil, refuse(authzen.ProblemInvalidRequest, "a signed approval carries the approval window it signed, in whole seconds")
	}
	challenge := passkeys.Challenge(r.ID, r.BindingHash, decision, until)
	if _, err := s.cfg.Passkeys.Verify(ctx, tx, v.Name, challenge, a); err != nil {
		if errors.Is(err, passkeys.ErrAssertion) {
			return nil, refuse(authzen.ProblemSignatureRequired, "rule %s requires a decision signed with your passkey: %v", r.Rule, err)
		}
		return nil, err
	}
	return a, nil
}

// approveTx issues the approval: its record (superseding earlier approvals of
// the same call for the same client), its signed state, and the transition.
func (s *Service) approveTx(ctx context.Context, tx pgx.Tx, r *Request, votes []Vote, actor string, now time.Time) (*Request, error) {
	p := r.ApprovalPolicy
	now = now.Truncate(time.Second) // approvals speak in RFC 3339 seconds
	until := r.ApprovalUntil(votes, now)
	approvalID := randid.New(ApprovalIDPrefix)
	// The submission was checked against the binding_token's actor_hash, so
	// the stored subject carries the evaluated chain.
	actors, err := authzen.ActorHash(r.Subject)
	if err != nil {
		return nil, fmt.Errorf("requests: actor hash: %w", err)
	}
	if _, err := tx.Exec(ctx, `UPDATE arap.approvals SET status = 'superseded', revoked_at = $3, revoked_by = $4, revoke_reason = 'superseded'
		WHERE client_id = $1 AND binding_hash = $2 AND actor_hash = $5 AND status = 'active'`, r.ClientID, r.BindingHash, now, "request:"+r.ID, actors); err != nil {
		return nil, fmt.Errorf("requests: supersede approvals: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO arap.approvals (id, request_id, client_id, rule, binding_hash, binding_context_members, actor_hash,
		status, approved_at, approved_until, grant_ready_at) VALUES ($1, $2, $3, $4, $5, $6, $7, 'active', $8, $9, $10)`,
		approvalID, r.ID, r.ClientID, r.Rule, r.BindingHash, r.BindingContextMembers, actors, now, until, now.Add(p.GrantDelay)); err != nil {
		return nil, fmt.Errorf("requests: insert approval: %w", err)
	}
	jti := make([]byte, 12)
	_, _ = rand.Read(jti)
	state, err := s.cfg.Keys.Sign(ctx, signing.TypeApproval, evaluation.ApprovalClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer: s.cfg.RequestsURL, Audience: jwt.ClaimStrings{s.cfg.Issuer},
			IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(until), ID: fmt.Sprintf("%x", jti),
		},
		ApprovalID: approvalID, RequestID: r.ID, BindingHash: r.BindingHash, BindingContextMembers: r.BindingContextMembers,
		ActorHash: actors, Rule: r.Rule, Scope: evaluation.ScopeExact, AuthorizedParty: r.ClientID,
	})
	if err != nil {
		return nil, err
	}
	result := &authzen.Result{Mode: authzen.ModeReevaluate, Approval: &authzen.Approval{
		ID: approvalID, ApprovedAt: now.Truncate(time.Second), ApprovedUntil: until, State: state,
	}}
	return s.TransitionTx(ctx, tx, r.ID, Change{To: Approved, Reason: ReasonApproved, Actor: actor, Result: result,
		Data: map[string]any{"approval_id": approvalID, "approved_until": until}})
}

// querier runs a query, in a transaction or on the pool.
type querier interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}

func votesTx(ctx context.Context, q querier, id string) ([]Vote, error) {
	votes, err := votesOf(ctx, q, []string{id})
	if err != nil {
		return nil, err
	}
	return append([]Vote{}, votes[id]...), nil // [] rather than null when there are none
}

// votesOf reads the votes on each of the requests ids, oldest first, in one
// query.
func votesOf(ctx context.Context, q querier, ids []string) (map[string][]Vote, error) {
	rows, err := q.Query(ctx, `SELECT request_id, voter, voter_kind, decision, reason, approved_until, at,
		coalesce(channel, ''), via_client_id, via_client_name, via_client_kind
		FROM arap.votes WHERE request_id = ANY($1) ORDER BY at, voter`, ids)
	if err != nil {
		return nil, fmt.Errorf("requests: votes: %w", err)
	}
	defer rows.Close()
	out := make(map[string][]Vote, len(ids))
	for rows.Next() {
		var id string
		var v Vote
		var viaID, viaName, viaKind *string
		if err := rows.Scan(&id, &v.Voter, &v.Kind, &v.Decision, &v.Reason, &v.ApprovedUntil, &v.At,
			&v.Channel, &viaID, &viaName, &viaKind); err != nil {
			return nil, fmt.Errorf("requests: votes: %w", err)
		}
		if viaID != nil && viaName != nil && viaKind != nil {
			v.Via = &Via{ClientID: *viaID, Client: *viaName, Kind: *viaKind}
		}
		out[id] = append(out[id], v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("requests: votes: %w", err)
	}
	return out, nil
}

// Votes returns the votes on request id, oldest first.
func (s *Service) Votes(ctx context.Context, id string) ([]Vote, error) {
	return votesTx(ctx, s.cfg.DB, id)
}

// VotesOf returns the votes on each of the requests, oldest first, in one
// query (for lists).
func (s *Service) VotesOf(ctx context.Context, list []*Request) (map[string][]Vote, error) {
	ids := make([]string, len(list))
	for i, r := range list {
		ids[i] = r.ID
	}
	return votesOf(ctx, s.cfg.DB, ids)
}
