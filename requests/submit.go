package requests

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/identity"
	"github.com/omcp/arap/internal/clean"
	"github.com/omcp/arap/internal/randid"
	"github.com/omcp/arap/internal/schemamsg"
	"github.com/omcp/arap/internal/telemetry"
	"github.com/omcp/arap/signing"
)

// Submitted is the outcome of a submission.
type Submitted struct {
	Request *Request
	// Replayed is true when an earlier submission with the same
	// Idempotency-Key and an equivalent body is being answered again.
	Replayed bool
}

// MaxIdempotencyKeyLen bounds the Idempotency-Key header.
const MaxIdempotencyKeyLen = 255

// Submit accepts an access request. The checks run in this order, and the
// first that fails decides the error: body syntax; structure; actor chain;
// binding_token signature, issuer and audience; freshness; binding; request
// schema; then, in the creating INSERT, the Idempotency-Key and the jti.
// A submission that fails in any of them, or on a passing fault, whose
// Idempotency-Key is already recorded is answered from that record instead:
// a retry after a lost response repeats its binding_token's jti, and may come
// after the token expired, and still gets the original handle back (or
// duplicate_request for a different body). A key whose request ended more
// than the idempotency retention ago is forgotten: the submission clears it
// from that request and is judged as new.
//
// key is the Idempotency-Key ("" for none: every such submission is new).
// body is the raw request body.
func (s *Service) Submit(ctx context.Context, caller Caller, key string, body []byte) (*Submitted, error) {
	key, err := parseIdempotencyKey(key)
	if err != nil {
		return nil, err
	}
	if err := clean.JSON(body); err != nil {
		return nil, refuse(authzen.ProblemInvalidRequest, "the body is refused: %v", err)
	}
	bodyHash, doc, err := hashBody(body)
	if err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		res, err := s.checkAndCreate(ctx, caller, key, bodyHash[:], body, doc)
		if key == "" || err == nil {
			return res, err
		}
		sub, stale, rerr := s.replay(ctx, s.cfg.DB, caller, key, bodyHash[:])
		if sub != nil || rerr != nil {
			return sub, rerr
		}
		if !errors.Is(err, errKeyTaken) {
			return nil, err
		}
		if attempt == maxKeyAttempts {
			return nil, errors.New("requests: idempotency key still contended after reclaiming it")
		}
		if stale {
			if err := s.reclaim(ctx, caller, key); err != nil {
				return nil, err
			}
		}
		// Otherwise nothing held the key when it was read: another
		// submission reclaimed it and has not committed its request yet.
		// The next INSERT waits for that one, then conflicts with it (and
		// is answered from it) or takes the key.
	}
}

// maxKeyAttempts bounds Submit's tries at a key: the first, one after
// reclaiming a stale key, one after waiting out a concurrent reclaimer.
const maxKeyAttempts = 3

func (s *Service) checkAndCreate(ctx context.Context, caller Caller, key string, bodyHash, body []byte, doc any) (*Submitted, error) {
	sub, err := decodeSubmission(body, doc)
	if err != nil {
		return nil, err
	}
	if err := checkActors(caller, sub); err != nil {
		return nil, err
	}
	if sub.Callback != nil {
		if s.cfg.CheckCallback == nil {
			return nil, refuse(authzen.ProblemCallbackRefused, "this service does not accept callbacks")
		}
		if err := s.cfg.CheckCallback(ctx, caller.ID, sub.Callback); err != nil {
			return nil, err
		}
	}
	claims, err := s.verifyBinding(ctx, caller, sub)
	if err != nil {
		return nil, err
	}
	rule, ok := s.cfg.Policy.Policy().RuleForTemplate(claims.Template)
	if !ok {
		return nil, refuse(authzen.ProblemNotRequestable, "the policy no longer offers the approval this denial pointed to (template %q); evaluate again", claims.Template)
	}
	if v := rule.ValidateSubmission(sub.Context, sub.RequestedAccess); len(v) > 0 {
		return nil, &Error{Code: authzen.ProblemSchemaViolation, Errors: v,
			Detail: "the submission does not satisfy the request schema at request_schema_url: " + schemamsg.Join(v)}
	}
	return s.create(ctx, caller, key, bodyHash, sub, claims, rule)
}

// hashBody returns the idempotency hash of body, SHA-256 of its RFC 8785
// form (as jcs.Transform writes it), and its generic decoding, which also
// serves the unknown-member checks: one decode for both. The v2 decoder
// refuses duplicate member names, as RFC 8785 does.
func hashBody(body []byte) ([sha256.Size]byte, any, error) {
	var doc any
	if err := jsonv2.Unmarshal(body, &doc); err != nil {
		return [sha256.Size]byte{}, nil, refuse(authzen.ProblemInvalidRequest, "the body is not valid JSON: %v", err)
	}
	canon, err := authzen.Canonical(doc)
	if err != nil {
		return [sha256.Size]byte{}, nil, refuse(authzen.ProblemInvalidRequest, "the body is not valid JSON: %v", err)
	}
	return sha256.Sum256(canon), doc, nil
}

func parseIdempotencyKey(k string) (string, error) {
	// RFC 8941 sf-string form ("...") and a bare token are both accepted.
	if len(k) >= 2 && k[0] == '"' && k[len(k)-1] == '"' {
		k = k[1 : len(k)-1]
	}
	if len(k) > MaxIdempotencyKeyLen {
		return "", refuse(authzen.ProblemInvalidIdempotencyKey, "Idempotency-Key is longer than %d characters", MaxIdempotencyKeyLen)
	}
	for _, c := range k {
		if c < 0x21 || c > 0x7e {
			return "", refuse(authzen.ProblemInvalidIdempotencyKey, "Idempotency-Key must be printable ASCII without spaces")
		}
	}
	return k, nil
}

// replay answers a repeated Idempotency-Key: the original handle for an
// equivalent body, duplicate_request for a different one, nothing if unseen.
// A key whose request ended more than the idempotency retention ago is
// answered with nothing and stale: it is reclaimable.
func (s *Service) replay(ctx context.Context, q Querier, caller Caller, key string, bodyHash []byte) (sub *Submitted, stale bool, err error) {
	r, stored, err := loadByKey(ctx, q, caller.ID, key)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("requests: idempotency lookup: %w", err)
	}
	if r.TerminalAt != nil && r.TerminalAt.Before(s.keyCutoff()) {
		return nil, true, nil
	}
	if subtle.ConstantTimeCompare(stored, bodyHash) != 1 {
		return nil, false, refuse(authzen.ProblemDuplicateRequest,
			"Idempotency-Key %q was already used with a different body (request %s); use a new key for a new request", key, r.ID)
	}
	return &Submitted{Request: r, Replayed: true}, false, nil
}

// loadByKey reads the request holding client clientID's Idempotency-Key
// key, and the hash of the body it was submitted with.
func loadByKey(ctx context.Context, q Querier, clientID, key string) (*Request, []byte, error) {
	var hash []byte
	r, err := scanRequest(prefixRow{q.QueryRow(ctx, `SELECT idempotency_hash, `+requestColumns+`
		FROM arap.requests WHERE client_id = $1 AND idempotency_key = $2`, clientID, key), &hash})
	if err != nil {
		return nil, nil, err
	}
	return r, hash, nil
}

// prefixRow scans its first column into first, the rest into Scan's dest.
type prefixRow struct {
	pgx.Row
	first any
}

func (p prefixRow) Scan(dest ...any) error { return p.Row.Scan(append([]any{p.first}, dest...)...) }

// keyCutoff is when a request must have ended for its Idempotency-Key to be
// reclaimable.
func (s *Service) keyCutoff() time.Time { return s.now().Add(-s.cfg.IdempotencyRetention) }

// reclaim clears key from the request holding it, if that request ended
// more than the idempotency retention ago (ARAP: reclaimable after it, and
// then treated as new). Changing nothing is not an error: a concurrent
// submission reclaimed it first.
func (s *Service) reclaim(ctx context.Context, caller Caller, key string) error {
	_, err := s.cfg.DB.Exec(ctx, `UPDATE arap.requests SET idempotency_key = NULL, idempotency_hash = NULL
		WHERE client_id = $1 AND idempotency_key = $2 AND terminal_at < $3`, caller.ID, key, s.keyCutoff())
	if err != nil {
		return fmt.Errorf("requests: reclaim idempotency key: %w", err)
	}
	return nil
}

// decodeSubmission reads body, whose generic decoding is doc.
func decodeSubmission(body []byte, doc any) (*authzen.Submission, error) {
	top, ok := doc.(map[string]any)
	if !ok {
		return nil, refuse(authzen.ProblemInvalidRequest, "the body must be a JSON object")
	}
	if err := unknownMembers(top, authzen.SubmissionMembers, ""); err != nil {
		return nil, err
	}
	if raw, ok := top["denial"]; ok && raw != nil {
		d, ok := raw.(map[string]any)
		if !ok {
			return nil, refuse(authzen.ProblemInvalidRequest, "denial must be an object")
		}
		if err := unknownMembers(d, authzen.DenialMembers, "denial."); err != nil {
			return nil, err
		}
	}
	var sub authzen.Submission
	if err := json.Unmarshal(body, &sub); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, refuse(authzen.ProblemInvalidRequest, "%s has the wrong type: expected %s", te.Field, te.Type)
		}
		return nil, refuse(authzen.ProblemInvalidRequest, "cannot read the submission: %v", err)
	}
	if _, items := top["items"]; len(sub.Items) > 0 || items {
		return nil, refuse(authzen.ProblemUnsupported, "bulk submissions (items) are not supported by this service; submit one request per denial")
	}
	if sub.Subject == nil || sub.Resource == nil || sub.Action == nil {
		return nil, refuse(authzen.ProblemInvalidRequest, "subject, resource and action are required (the ones from the denied evaluation)")
	}
	if v := evaluation.ValidateRequest(authzen.EvaluationRequest{Subject: sub.Subject, Resource: sub.Resource, Action: sub.Action, Context: sub.Context}); len(v) > 0 {
		return nil, &Error{Code: authzen.ProblemInvalidRequest, Errors: v, Detail: "subject, resource or action is malformed: " + schemamsg.Join(v)}
	}
	if sub.Denial == nil {
		return nil, refuse(authzen.ProblemNotRequestable, "the submission has no denial: an access request must come from a requestable denial (context.access_request)")
	}
	if sub.Denial.BindingToken == "" {
		return nil, refuse(authzen.ProblemInvalidDenialBinding, "denial.binding_token is required: this service does not share state with the PDP, so evaluation_id alone cannot be verified")
	}
	if sub.Denial.ExpiresAt == nil {
		return nil, refuse(authzen.ProblemInvalidDenialBinding, "denial.expires_at is required: echo context.access_request.expires_at")
	}
	return &sub, nil
}

// unknownMembers refuses members outside known. The submission's top level
// and its denial are not ARAP extension points; an unknown name there is a
// mistake (a typo of a required member, usually) and is reported as such.
func unknownMembers(obj map[string]any, known []string, prefix string) error {
	var bad []string
	for k := range obj {
		if !slices.Contains(known, k) {
			bad = append(bad, prefix+k)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	return refuse(authzen.ProblemInvalidRequest, "unknown member(s) %s; allowed: %s", strings.Join(bad, ", "), prefix+strings.Join(known, ", "+prefix))
}

// checkActors verifies that the caller may assert every actor it names, in
// client.actor (and its act chain) and in subject.properties.act: ARAP
// requires the whole claimed chain to be authorized by the caller. The
// chains are walked by authzen.ActorChain, as eligibility walks them, so a
// chain too deep to check whole is refused rather than checked in part.
func checkActors(caller Caller, sub *authzen.Submission) error {
	ids, err := authzen.SubjectActors(sub.Subject)
	if err != nil {
		return refuse(authzen.ProblemInvalidRequest, "%v", err)
	}
	if sub.Client != nil && sub.Client.Actor != nil {
		client, err := authzen.ActorChain(sub.Client.Actor, "id", "client.actor")
		if err != nil {
			return refuse(authzen.ProblemInvalidRequest, "%v", err)
		}
		for _, id := range client {
			if err := identity.Check(id); err != nil {
				return refuse(authzen.ProblemInvalidRequest, "client.actor: the actor identifier %v", err)
			}
		}
		ids = append(client, ids...)
	}
	for _, id := range ids {
		if id == "" {
			return refuse(authzen.ProblemInvalidRequest, "every actor in the chain needs an id (client.actor.id, act.sub)")
		}
		if caller.MayAssertActor == nil || !caller.MayAssertActor(id) {
			return refuse(authzen.ProblemActorNotAuthorized, "client %q is not allowed to act through actor %q; an operator can allow it (arapctl clients create --actor)", caller.Name, id)
		}
	}
	return nil
}

// verifyBinding checks the binding_token: signature, issuer, audience and
// intended client; then freshness; then that it binds this submission's
// subject, resource, action and relevant context. Its jti is spent by create.
func (s *Service) verifyBinding(ctx context.Context, caller Caller, sub *authzen.Submission) (*evaluation.BindingClaims, error) {
	d := sub.Denial
	invalid := func(format string, args ...any) error {
		return refuse(authzen.ProblemInvalidDenialBinding, format, args...)
	}
	var c evaluation.BindingClaims
	if err := s.cfg.Keys.Verify(ctx, signing.TypeBinding, d.BindingToken, &c); err != nil {
		if errors.Is(err, signing.ErrMalformed) || errors.Is(err, signing.ErrBadSignature) || errors.Is(err, signing.ErrUnknownKey) ||
			errors.Is(err, signing.ErrKeyExpired) || errors.Is(err, signing.ErrWrongType) {
			return nil, invalid("denial.binding_token does not verify: %v", err)
		}
		return nil, err
	}
	if c.Issuer != s.cfg.Issuer {
		return nil, invalid("denial.binding_token was issued by %q, not by this deployment's PDP", c.Issuer)
	}
	if len(c.Audience) == 0 || !slices.Contains([]string(c.Audience), s.cfg.RequestsURL) {
		return nil, invalid("denial.binding_token is not meant for this Access Request Service (aud)")
	}
	if c.AuthorizedParty != caller.ID {
		return nil, invalid("denial.binding_token was issued to a different client; submit from the client that evaluated")
	}
	if c.ID == "" || c.ExpiresAt == nil {
		return nil, invalid("denial.binding_token lacks jti or exp")
	}
	// jti replay is refused by create, whose INSERT of the jti is the check
	// that holds under concurrency; a lookup here cost every submission a
	// round trip for an earlier error message.

	// Freshness: the earlier of exp and the protected denial expiry, which
	// the echoed denial.expires_at must match.
	deadline := c.ExpiresAt.Time
	if c.DenialExpiresAt != "" {
		protected, err := time.Parse(time.RFC3339, c.DenialExpiresAt)
		if err != nil {
			return nil, invalid("denial.binding_token has a malformed denial_expires_at")
		}
		if !protected.Equal(*d.ExpiresAt) {
			return nil, invalid("denial.expires_at (%s) does not match the expiry the PDP signed (%s)", d.ExpiresAt.Format(time.RFC3339), c.DenialExpiresAt)
		}
		if protected.Before(deadline) {
			deadline = protected
		}
	} else if deadline.After(*d.ExpiresAt) {
		return nil, invalid("denial.binding_token cannot prove the denial's freshness: its exp is later than denial.expires_at and it carries no denial_expires_at")
	}
	if s.now().After(deadline.Add(s.cfg.ClockSkew)) {
		return nil, refuse(authzen.ProblemExpiredDenial, "the requestable denial expired at %s; evaluate again for a fresh one", deadline.UTC().Format(time.RFC3339))
	}

	hash, err := authzen.BindingHash(sub.Subject, sub.Resource, sub.Action, sub.Context, c.BindingContextMembers)
	if err != nil {
		return nil, invalid("cannot compute the binding of this submission: %v", err)
	}
	if subtle.ConstantTimeCompare([]byte(hash), []byte(c.BindingHash)) != 1 {
		return nil, invalid("the submission's subject, resource, action or %s does not match the denied evaluation", describeMembers(c.BindingContextMembers))
	}
	actors, err := authzen.ActorHash(sub.Subject)
	if err != nil {
		return nil, invalid("cannot compute the actor binding of this submission: %v", err)
	}
	if c.ActorHash == "" || subtle.ConstantTimeCompare([]byte(actors), []byte(c.ActorHash)) != 1 {
		return nil, invalid("the submission's actor chain (subject.properties.act) is not the one of the denied evaluation; the agent is part of what is approved")
	}
	if d.EvaluationID != "" && d.EvaluationID != c.EvaluationID {
		return nil, invalid("denial.evaluation_id does not match the binding_token")
	}
	return &c, nil
}

func describeMembers(m []string) string {
	if len(m) == 0 {
		return "context"
	}
	return "context (" + strings.Join(m, ", ") + ")"
}

// create writes the request, the first audit event and the outbox row in
// one round trip: a pipeline with one Sync is one implicit transaction, and
// any failing statement rolls back the others. The request row carries the
// Idempotency-Key (with the body's hash) and the spent jti, each under a
// unique index (migration 0022), so its INSERT is the idempotency and
// replay check: a concurrent duplicate blocks on the first's index entry
// until the first commits and then fails on it (errKeyTaken, or the jti's
// refusal, which Submit answers from the key all the same): concurrent
// duplicates create one request. A rule with resolvers also schedules them,
// which needs River's insert in an explicit transaction.
func (s *Service) create(ctx context.Context, caller Caller, key string, bodyHash []byte, sub *authzen.Submission, c *evaluation.BindingClaims, rule *evaluation.Rule) (*Submitted, error) {
	now := s.now()
	// The denial is kept without its binding_token, which nothing reads once
	// verified (the row keeps its evaluation_id, binding_hash and jti):
	// with it, a request row outgrew a page's inline limit, and every one
	// was written twice, the token out of line (TOAST).
	denial := *sub.Denial
	denial.BindingToken = ""
	r := &Request{
		ID:                    randid.New(RequestIDPrefix),
		ClientID:              caller.ID,
		Status:                Pending,
		Rule:                  rule.Name,
		Subject:               sub.Subject,
		Resource:              sub.Resource,
		Action:                sub.Action,
		Context:               sub.Context,
		RequestedAccess:       sub.RequestedAccess,
		ClientInfo:            sub.Client,
		Denial:                denial,
		EvaluationID:          c.EvaluationID,
		BindingHash:           c.BindingHash,
		BindingContextMembers: c.BindingContextMembers,
		Display:               rule.Display,
		ApprovalPolicy:        rule.Approval,
		Callback:              sub.Callback,
		ExpiresAt:             now.Add(rule.RequestTTL).Truncate(time.Second),
		CreatedAt:             now,
		UpdatedAt:             now,
		TraceParent:           telemetry.TraceParent(ctx),
	}
	var keyHash []byte // NULL without a key, as the key
	if key != "" {
		keyHash = bodyHash
	}
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO arap.requests (id, client_id, status, rule, subject, resource, action, context,
		requested_access, client_info, denial, evaluation_id, binding_hash, binding_context_members, display,
		expires_at, created_at, updated_at, approval_policy, callback, next_reminder_at, escalate_at, trace_parent,
		idempotency_key, idempotency_hash, binding_jti)
		VALUES ($1, $2, 'pending', $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $16, $17, $18, $19, $20, nullif($21, ''),
		nullif($22, ''), $23, $24)`,
		r.ID, r.ClientID, r.Rule, r.Subject, r.Resource, r.Action, r.Context, r.RequestedAccess, r.ClientInfo, r.Denial,
		r.EvaluationID, r.BindingHash, r.BindingContextMembers, r.Display, r.ExpiresAt, now, r.ApprovalPolicy, r.Callback,
		after(now, r.ApprovalPolicy.RemindEvery), after(now, r.ApprovalPolicy.EscalateAfter), r.TraceParent,
		key, keyHash, c.ID)
	if err := audit.QueueFirst(b, audit.Event{Chain: r.ID, Kind: "request.submitted", Actor: caller.principal(), At: now,
		Data: map[string]any{
			"client_id": caller.ID, "rule": r.Rule, "evaluation_id": r.EvaluationID, "binding_hash": r.BindingHash,
			"subject": r.Subject.Str("id"), "resource": r.Resource.Str("type") + ":" + r.Resource.Str("id"),
			"action": r.Action.Str("name"), "expires_at": r.ExpiresAt, "idempotency_key_used": key != "",
			// So that audit verify knows, from the log alone, that
			// every person's vote must be signed.
			"require_passkey": r.ApprovalPolicy.RequirePasskey,
		}}); err != nil {
		return nil, err
	}
	if s.cfg.Events != nil {
		s.cfg.Events.QueueTx(b, Event{Kind: EventCreated, RequestID: r.ID})
	}
	var err error
	if len(rule.Resolvers) == 0 {
		err = createErr(s.cfg.DB.SendBatch(ctx, b).Close())
	} else {
		err = pgx.BeginFunc(ctx, s.cfg.DB, func(tx pgx.Tx) error {
			if err := createErr(tx.SendBatch(ctx, b).Close()); err != nil {
				return err
			}
			if _, err := s.cfg.Jobs.InsertTx(ctx, tx, ResolveArgs{RequestID: r.ID}, nil); err != nil {
				return fmt.Errorf("requests: schedule resolvers: %w", err)
			}
			return nil
		})
	}
	if err != nil {
		return nil, err
	}
	submitted.Inc()
	return &Submitted{Request: r}, nil
}

// errKeyTaken is a creation that found its Idempotency-Key recorded.
var errKeyTaken = errors.New("requests: idempotency key taken")

// The unique indexes of arap.requests that are the idempotency and replay
// checks (migration 0022).
const (
	indexIdempotencyKey = "requests_idempotency_key"
	indexBindingJTI     = "requests_binding_jti"
)

// createErr names the creating batch's failure: the request's two unique
// keys besides its id are the idempotency and replay checks.
func createErr(err error) error {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == indexIdempotencyKey:
		return errKeyTaken
	case errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == indexBindingJTI:
		return refuse(authzen.ProblemInvalidDenialBinding, "denial.binding_token has already been used for another request (jti replay); evaluate again for a fresh denial")
	}
	return fmt.Errorf("requests: create: %w", err)
}
