// Package evaluation is the Policy Decision Point: it answers AuthZEN access
// evaluations from a YAML policy whose conditions are CEL expressions.
//
// A decision is allow, deny, or a requestable deny. A requestable deny carries
// context.access_request with a binding_token: an ES256 JWS that binds the
// denied subject, resource, action and relevant context (by binding_hash) so
// that the Access Request Service can verify a later submission without
// sharing state with the PDP.
//
// The policy is loaded at start and can be reloaded (SIGHUP); a file with
// errors is rejected with line-level messages and the running policy stays.
package evaluation

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/interpreter"
	"github.com/oklog/ulid/v2"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/identity"
	"github.com/omcp/arap/internal/dbdown"
	"github.com/omcp/arap/internal/schemamsg"
	"github.com/omcp/arap/signing"
)

// Options configure an Engine.
type Options struct {
	// PolicyFile is reloaded by Reload. Optional when Policy is given.
	PolicyFile string
	// Policy is the initial policy; loaded from PolicyFile when nil.
	Policy *Policy
	Keys   *signing.Keys
	// Issuer identifies this PDP (its public base URL); it is the
	// binding_token "iss".
	Issuer string
	// RequestsURL is the Access Request endpoint; the binding_token "aud".
	RequestsURL string
	// SchemaURL returns the request_schema_url of a template.
	SchemaURL func(template string) string
	// Attributes supplies attributes.<key> to conditions; none when nil.
	Attributes AttributeSource
	// SubjectSources are the subject attribute sources a policy may name in
	// subject_attributes.source (e.g. "directory"); a file source needs no
	// registration.
	SubjectSources map[string]SubjectSource
	// Approvals resolves approval ids at re-evaluation; without it every
	// presented approval is unverifiable.
	Approvals Approvals
	// Cache says which allowed decisions a PEP may reuse (CtxCache); none
	// when its MaxAge is zero.
	Cache CacheOptions
	Now   func() time.Time
	Log   *slog.Logger
}

// CacheOptions say which allowed decisions are marked cacheable
// (authzen.CtxCache), and for how long. A decision is marked only when it
// is an allow, from no re-evaluation, and the conditions evaluated to reach
// it (the deciding rule's and those of every rule before it whose match
// held) read nothing but the request and what the deployment announces
// every change of (package announce): never the time (now, windows), never
// an attribute or subject source whose changes are not announced. Anything
// else is not marked: the default is no reuse.
type CacheOptions struct {
	// MaxAge bounds a reuse; zero marks nothing.
	MaxAge time.Duration
	// Attributes says every change of Options.Attributes is announced.
	Attributes bool
	// Sources names the SubjectSources whose every change is announced. A
	// subject_attributes file is read with the policy, so a reload (which
	// is announced) is its only change.
	Sources []string
}

// AttributeSource gives the current attributes.
type AttributeSource interface {
	Snapshot(ctx context.Context) (map[string]any, error)
}

// Engine evaluates access requests against the current policy.
type Engine struct {
	opts   Options
	policy atomic.Pointer[Policy]
}

// New builds an Engine.
func New(opts Options) (*Engine, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Keys == nil || opts.Issuer == "" || opts.RequestsURL == "" {
		return nil, errors.New("evaluation: Keys, Issuer and RequestsURL are required")
	}
	e := &Engine{opts: opts}
	p := opts.Policy
	if p == nil {
		if opts.PolicyFile == "" {
			return nil, errors.New("evaluation: a policy or policy file is required")
		}
		var err error
		if p, err = LoadFile(opts.PolicyFile); err != nil {
			return nil, err
		}
	}
	if err := e.usable(p); err != nil {
		return nil, err
	}
	e.policy.Store(p)
	return e, nil
}

// usable checks what a policy needs from the deployment.
func (e *Engine) usable(p *Policy) error {
	if sa := p.SubjectAttributes; sa != nil && sa.file == nil && e.opts.SubjectSources[sa.Source] == nil {
		names := make([]string, 0, len(e.opts.SubjectSources))
		for n := range e.opts.SubjectSources {
			names = append(names, n)
		}
		slices.Sort(names)
		return fmt.Errorf("policy %s: subject_attributes.source %q is not a source of this deployment (it has: %s)", p.Source, sa.Source, strings.Join(names, ", "))
	}
	return nil
}

// Policy returns the policy in force.
func (e *Engine) Policy() *Policy { return e.policy.Load() }

// SetPolicy replaces the policy in force. Unlike New and Reload it does not
// check that a subject_attributes source is registered; if it is not, every
// evaluation that reads subject_attributes denies (policy_error).
func (e *Engine) SetPolicy(p *Policy) { e.policy.Store(p) }

// Reload re-reads the policy file. On error the current policy stays.
func (e *Engine) Reload() error {
	if e.opts.PolicyFile == "" {
		return errors.New("evaluation: no policy file to reload")
	}
	p, err := LoadFile(e.opts.PolicyFile)
	if err != nil {
		return err
	}
	if err := e.usable(p); err != nil {
		return err
	}
	e.policy.Store(p)
	return nil
}

// BindingClaims are the claims of a binding_token.
type BindingClaims struct {
	jwt.RegisteredClaims
	EvaluationID          string   `json:"evaluation_id"`
	DenialExpiresAt       string   `json:"denial_expires_at"`
	BindingContextMembers []string `json:"binding_context_members"`
	BindingHash           string   `json:"binding_hash"`
	// ActorHash binds the delegation chain (authzen.ActorHash), which
	// binding_hash leaves out: a submission through another agent, or none,
	// does not match the denial.
	ActorHash string `json:"actor_hash"`
	// Template names the rule that made the denial requestable. The ARS routes
	// on this signed value, never on the PEP's echo of access_request.template.
	Template string `json:"template"`
	// AuthorizedParty is the API client that asked for the evaluation; only
	// it may submit the request, so a leaked token is useless to others.
	AuthorizedParty string `json:"azp,omitempty"`
}

// Outcome is a decision plus what produced it, for the caller's logs and
// metrics; only Decision goes on the wire.
type Outcome struct {
	Decision authzen.Decision
	Rule     string // "" when no rule matched
	Effect   string
	// Reeval is true when the request presented an approval; Reason is the
	// re-evaluation's reason code then.
	Reeval bool
	Reason string
}

// Evaluate decides one request for the API client callerID. The request must
// already be valid (see ValidateRequest).
func (e *Engine) Evaluate(ctx context.Context, callerID string, req authzen.EvaluationRequest) (Outcome, error) {
	p := e.policy.Load()
	now := e.opts.Now().UTC().Truncate(time.Second)
	evalID := "eval_" + ulid.Make().String()
	deny := func(reason string) authzen.Decision {
		return authzen.Decision{Decision: false, Context: authzen.Object{
			authzen.CtxEvaluationID: evalID, authzen.CtxEvaluatedAt: now, authzen.CtxReason: reason}}
	}
	if approval, ok := req.Context[authzen.CtxApproval]; ok {
		return e.reevaluate(ctx, p, callerID, req, approval, evalID, now)
	}
	rule, reads, err := e.match(ctx, p, req, now)
	if noVerdict(err) {
		return Outcome{}, err
	}
	if err != nil {
		// Fail closed: a rule we could not evaluate might have denied.
		e.opts.Log.WarnContext(ctx, "policy rule failed to evaluate; denying", "error", err)
		return Outcome{Decision: deny(authzen.ReasonPolicyError), Effect: EffectDeny}, nil
	}
	if rule == nil {
		return Outcome{Decision: deny(authzen.ReasonNoMatchingRule), Effect: EffectDeny}, nil
	}
	out := Outcome{Rule: rule.Name, Effect: rule.Effect}
	switch rule.Effect {
	case EffectAllow:
		out.Decision = authzen.Decision{Decision: true, Context: authzen.Object{authzen.CtxEvaluationID: evalID}}
		if age := e.cacheFor(p, reads); age > 0 {
			out.Decision.Context[authzen.CtxCache] = authzen.CacheHint{MaxAge: int(age / time.Second)}
		}
	case EffectDeny:
		out.Decision = deny(rule.Reason)
	case EffectRequest:
		d := deny(rule.Reason)
		hint, err := e.requestableHint(ctx, callerID, rule, req, evalID, now)
		if err != nil {
			return Outcome{}, err
		}
		d.Context[authzen.CtxAccessRequest] = hint
		out.Decision = d
	}
	return out, nil
}

// activation builds the inputs of policy conditions: the request, the
// time, the attributes, which windows are open, and, when a condition
// reads them, the subject's attributes and the definitions.
func (e *Engine) activation(ctx context.Context, p *Policy, req authzen.EvaluationRequest, now time.Time) (*activation, error) {
	ctxObj := map[string]any{}
	for k, v := range req.Context {
		if k != authzen.CtxApproval { // an input to the decision, never to conditions
			ctxObj[k] = v
		}
	}
	attrs := map[string]any{}
	if e.opts.Attributes != nil {
		var err error
		if attrs, err = e.opts.Attributes.Snapshot(ctx); err != nil {
			return nil, err
		}
	}
	windows := make(map[string]bool, len(p.Windows))
	for name, w := range p.Windows {
		windows[name] = w.Open(now)
	}
	return &activation{ctx: ctx, e: e, p: p, vars: map[string]any{
		varSubject:    map[string]any(req.Subject),
		varResource:   map[string]any(req.Resource),
		varAction:     map[string]any(req.Action),
		varContext:    ctxObj,
		varNow:        now,
		varAttributes: attrs,
		varWindows:    windows,
	}}, nil
}

// noVerdict says a failure is no decision: the decision's inputs (the
// attributes, a subject lookup, the approval, the keys) could not be read
// because the database is unavailable, which passes. The caller gets an
// error it may retry, never a denial it would act on, and never an allow.
// Any other failure fails closed (a denial), since waiting would not end it.
func noVerdict(err error) bool { return dbdown.Is(err) }

// activation resolves condition variables for one evaluation. The subject
// lookup and the definitions are lazy: computed the first time a condition
// reads them, then kept for the rest of the evaluation, so rules that do not
// read them cost nothing and rules that do share one lookup.
type activation struct {
	ctx  context.Context
	e    *Engine
	p    *Policy
	vars map[string]any
	memo map[string]any
	// reads are the inputs beyond the request that the conditions
	// evaluated so far have read (a definition's reads are its reader's).
	reads inputs
}

// inputs are what conditions read besides the request itself; they decide
// whether a decision may be reused (cacheFor).
type inputs uint8

const (
	readClock             inputs = 1 << iota // now, windows
	readAttributes                           // attributes
	readSubjectAttributes                    // subject_attributes
)

// ResolveName implements interpreter.Activation. Every variable a condition
// reads passes here, so reads is what the conditions actually read.
func (a *activation) ResolveName(name string) (any, bool) {
	switch name {
	case varNow, varWindows:
		a.reads |= readClock
	case varAttributes:
		a.reads |= readAttributes
	case varSubjectAttributes:
		a.reads |= readSubjectAttributes
	}
	if v, ok := a.vars[name]; ok {
		return v, true
	}
	if v, ok := a.memo[name]; ok {
		return v, true
	}
	var v any
	switch d := a.p.Definitions[name]; {
	case name == varSubjectAttributes && a.p.SubjectAttributes != nil:
		attrs, err := a.e.subjectAttributes(a.ctx, a.p.SubjectAttributes, a.vars[varSubject].(map[string]any))
		if err != nil {
			v = types.WrapErr(err)
		} else {
			v = attrs
		}
	case d != nil:
		// Definitions are acyclic (checked at load), so this recursion ends.
		val, _, err := d.program.Eval(a)
		if err != nil {
			v = types.WrapErr(fmt.Errorf("definition %q: %w", name, err))
		} else {
			v = val
		}
	default:
		return nil, false
	}
	if a.memo == nil {
		a.memo = map[string]any{}
	}
	a.memo[name] = v
	return v, true
}

// Parent implements interpreter.Activation.
func (a *activation) Parent() interpreter.Activation { return nil }

// match returns the first rule that applies, or nil, and what the
// conditions evaluated to find it read (a rule whose match did not hold is
// decided by the request alone).
func (e *Engine) match(ctx context.Context, p *Policy, req authzen.EvaluationRequest, now time.Time) (*Rule, inputs, error) {
	vars, err := e.activation(ctx, p, req, now)
	if err != nil {
		return nil, 0, err
	}
	for _, r := range p.Rules {
		if !r.Match.matches(req) {
			continue
		}
		if r.program == nil {
			return r, vars.reads, nil
		}
		val, _, err := r.program.Eval(vars)
		if err != nil {
			return nil, vars.reads, fmt.Errorf("rule %q: %w", r.Name, err)
		}
		b, ok := val.Value().(bool)
		if !ok {
			return nil, vars.reads, fmt.Errorf("rule %q: condition returned %T, not bool", r.Name, val.Value())
		}
		if b {
			return r, vars.reads, nil
		}
	}
	return nil, vars.reads, nil
}

// cacheFor is how long an allow of p reached by conditions that read reads
// may be reused (CacheOptions): zero unless everything read is announced.
func (e *Engine) cacheFor(p *Policy, reads inputs) time.Duration {
	c := e.opts.Cache
	switch {
	case c.MaxAge < time.Second, reads&readClock != 0:
		return 0
	case reads&readAttributes != 0 && !c.Attributes:
		return 0
	case reads&readSubjectAttributes != 0:
		sa := p.SubjectAttributes
		if sa == nil || (sa.file == nil && !slices.Contains(c.Sources, sa.Source)) {
			return 0
		}
	}
	return c.MaxAge
}

func (m Match) matches(req authzen.EvaluationRequest) bool {
	return (m.Action == "" || m.Action == req.Action.Str("name")) &&
		(m.Actions == nil || slices.Contains(m.Actions, req.Action.Str("name"))) &&
		(m.ResourceType == "" || m.ResourceType == req.Resource.Str("type")) &&
		(m.ResourceID == "" || m.ResourceID == req.Resource.Str("id")) &&
		(m.SubjectType == "" || m.SubjectType == req.Subject.Str("type"))
}

func (e *Engine) requestableHint(ctx context.Context, callerID string, r *Rule, req authzen.EvaluationRequest, evalID string, now time.Time) (authzen.AccessRequestHint, error) {
	expires := now.Add(r.DenialTTL)
	hash, err := authzen.BindingHash(req.Subject, req.Resource, req.Action, req.Context, r.ContextMembers)
	if err != nil {
		return authzen.AccessRequestHint{}, fmt.Errorf("evaluation: binding hash: %w", err)
	}
	actorHash, err := authzen.ActorHash(req.Subject)
	if err != nil {
		return authzen.AccessRequestHint{}, fmt.Errorf("evaluation: actor hash: %w", err)
	}
	jti := make([]byte, 16)
	_, _ = rand.Read(jti)
	claims := BindingClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    e.opts.Issuer,
			Audience:  jwt.ClaimStrings{e.opts.RequestsURL},
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(expires),
			ID:        base64.RawURLEncoding.EncodeToString(jti),
		},
		EvaluationID:          evalID,
		DenialExpiresAt:       expires.Format(time.RFC3339),
		BindingContextMembers: r.ContextMembers,
		BindingHash:           hash,
		ActorHash:             actorHash,
		Template:              r.Template,
		AuthorizedParty:       callerID,
	}
	token, err := e.opts.Keys.Sign(ctx, signing.TypeBinding, claims)
	if err != nil {
		return authzen.AccessRequestHint{}, err
	}
	hint := authzen.AccessRequestHint{
		Template:     r.Template,
		ExpiresAt:    expires,
		BindingToken: token,
		Display:      r.Display,
	}
	if r.RequestSchema != nil && e.opts.SchemaURL != nil {
		hint.RequestSchemaURL = e.opts.SchemaURL(r.Template)
	}
	return hint, nil
}

// RuleForTemplate finds the requestable rule a template names.
func (p *Policy) RuleForTemplate(template string) (*Rule, bool) {
	for _, r := range p.Rules {
		if r.Effect == EffectRequest && r.Template == template {
			return r, true
		}
	}
	return nil, false
}

// ValidateSubmission checks a submission's additions against the rule's
// request_schema and returns the violations (none when valid).
func (r *Rule) ValidateSubmission(context, requestedAccess map[string]any) []string {
	if r.compiledSchema == nil {
		return nil
	}
	inst := map[string]any{}
	if context != nil {
		inst["context"] = context
	}
	if requestedAccess != nil {
		inst["requested_access"] = requestedAccess
	}
	return Violations(r.compiledSchema.Validate(inst))
}

//go:embed authzen-evaluation-request.schema.json
var requestSchemaJSON string

var requestSchema = func() *jsonschema.Schema {
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(requestSchemaJSON))
	if err != nil {
		panic(err)
	}
	c := jsonschema.NewCompiler()
	const url = "https://openid.net/schemas/authzen-evaluation-request.json"
	if err := c.AddResource(url, doc); err != nil {
		panic(err)
	}
	return c.MustCompile(url)
}()

// ValidateRequest checks req against the AuthZEN 1.0 request schema, and
// its subject's identifiers and actor chain, and returns the violations.
func ValidateRequest(req authzen.EvaluationRequest) []string {
	if fitsRequestSchema(req) {
		return identityViolations(req.Subject)
	}
	inst := map[string]any{}
	for k, v := range map[string]authzen.Object{"subject": req.Subject, "resource": req.Resource, "action": req.Action, "context": req.Context} {
		if v != nil {
			inst[k] = map[string]any(v)
		}
	}
	return append(Violations(requestSchema.Validate(inst)), identityViolations(req.Subject)...)
}

// identityViolations refuses a subject whose id, type or actor ids are not
// canonical (identity.Check), and an actor chain that cannot be walked whole:
// separation of duties compares these as identities, and a spelling that
// is not canonical would be a way to pass as someone else.
func identityViolations(subject authzen.Object) []string {
	var out []string
	for _, k := range []string{"type", "id"} {
		if s, ok := subject[k].(string); ok {
			if err := identity.Check(s); err != nil {
				out = append(out, fmt.Sprintf("subject.%s: the identifier %v", k, err))
			}
		}
	}
	actors, err := authzen.SubjectActors(subject)
	if err != nil {
		return append(out, err.Error())
	}
	where := "subject.properties.act"
	for _, id := range actors {
		if err := identity.Check(id); err != nil {
			out = append(out, fmt.Sprintf("%s.sub: the actor identifier %v", where, err))
		}
		where += ".act"
	}
	return out
}

// Violations words a JSON Schema validation error, one line per failing
// value: the field as it is spelled, what is wrong, and what to do.
func Violations(err error) []string { return schemamsg.Messages(err) }
