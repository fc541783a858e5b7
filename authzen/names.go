package authzen

// Wire names that the drafts may still rename live here and nowhere else.

// Discovery.
const (
	WellKnownPath = "/.well-known/authzen-configuration"
	// CapabilityAccessRequest advertises ARAP support in PDP metadata.
	CapabilityAccessRequest = "urn:openid:authzen:capability:access-request"
)

// Default endpoint paths. Clients use the discovered URLs, never these.
const (
	PathEvaluation  = "/access/v1/evaluation"
	PathEvaluations = "/access/v1/evaluations"
	PathRequests    = "/access/v1/requests"
	PathJWKS        = "/access/v1/jwks"
	PathSchemas     = "/access/v1/schemas"
)

// PathDecisionChanges is this server's own (not AuthZEN's) change stream:
// a text/event-stream that starts with EventHello and carries an
// EventChange whenever a decision marked CtxCache may have changed (a
// policy reload, an attribute, the directory, the client's revocation).
const PathDecisionChanges = "/v1/decisions/changes"

// Events of the change stream, and the members of their data (JSON).
const (
	EventHello  = "hello"  // data: {epoch, keepalive, settle}
	EventChange = "change" // data: {epoch, kind}
)

// Kinds of an EventChange: what changed.
const (
	ChangePolicy     = "policy"
	ChangeAttributes = "attributes"
	ChangeDirectory  = "directory"
	ChangeClient     = "client"
)

// Batch evaluation semantics (AuthZEN 1.0 section 7.1.2).
const (
	SemanticExecuteAll          = "execute_all"
	SemanticDenyOnFirstDeny     = "deny_on_first_deny"
	SemanticPermitOnFirstPermit = "permit_on_first_permit"
)

// Decision context members defined by ARAP.
const (
	CtxEvaluationID  = "evaluation_id"
	CtxEvaluatedAt   = "evaluated_at"
	CtxReason        = "reason"
	CtxAccessRequest = "access_request"
	CtxApproval      = "approval"
	CtxNextAction    = "next_action"
	CtxRetryAfter    = "retry_after"
)

// CtxCache is this PDP's own member of an allowed decision's context (not
// ARAP's, hence the reverse-DNS name): the decision may be reused for the
// same evaluation request, within max_age seconds and while the PEP hears
// the backend's change stream (PathDecisionChanges). Its value is a
// CacheHint. No other decision carries it.
const CtxCache = "arap.omcp.dev/cache"

// MachineryContextMembers are never authorization-relevant (ARAP Terminology).
var MachineryContextMembers = []string{CtxAccessRequest, CtxEvaluationID, CtxEvaluatedAt, CtxReason, CtxApproval}

// Reason codes.
const (
	ReasonApprovalRequired = "approval_required"
	ReasonPolicyDenied     = "policy_denied"
	ReasonNoMatchingRule   = "no_matching_rule"
	ReasonPolicyError      = "policy_error"

	// Re-evaluation denial reasons (ARAP section 7).
	ReasonApprovalExpired      = "approval_expired"
	ReasonOutOfScope           = "out_of_scope"
	ReasonGrantPending         = "grant_pending"
	ReasonApprovalUnverifiable = "approval_unverifiable"
)

// Next actions after a re-evaluation denial.
const (
	NextActionRequest = "request"
	NextActionRetry   = "retry"
	NextActionNone    = "none"
)

// Task statuses (ARAP section 5.1).
const (
	StatusPending   = "pending"
	StatusApproved  = "approved"
	StatusDenied    = "denied"
	StatusExpired   = "expired"
	StatusCancelled = "cancelled"
	StatusFailed    = "failed"
	StatusPartial   = "partial"
)

// ModeReevaluate is the only base completion mode.
const ModeReevaluate = "reevaluate"

// Headers.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderRequestID      = "X-Request-ID"
	// HeaderIdempotentReplayed marks a response replayed for a repeated key.
	HeaderIdempotentReplayed = "Idempotent-Replayed"
)

// Problem types. ProblemPrefix + code is the RFC 9457 "type" for the codes the
// ARAP draft defines; LocalProblemPrefix + code for the ones it leaves open
// (malformed bodies, authentication, limits), which it says to define locally.
const (
	ProblemPrefix      = "urn:openid:authzen:access-request:error:"
	LocalProblemPrefix = "urn:omcp:arap:error:"

	ProblemNotRequestable       = "not_requestable"
	ProblemExpiredDenial        = "expired_denial"
	ProblemInvalidDenialBinding = "invalid_denial_binding"
	ProblemDuplicateRequest     = "duplicate_request"
	ProblemUnknownTask          = "unknown_task"
	ProblemTaskExpired          = "task_expired"
	ProblemInvalidTaskState     = "invalid_task_state"

	ProblemInvalidRequest        = "invalid_request"
	ProblemInvalidIdempotencyKey = "invalid_idempotency_key"
	ProblemSchemaViolation       = "schema_violation"
	ProblemUnsupported           = "unsupported"
	ProblemActorNotAuthorized    = "actor_not_authorized"
	ProblemUnauthorized          = "unauthorized"
	ProblemInsufficientScope     = "insufficient_scope"
	ProblemPayloadTooLarge       = "payload_too_large"
	ProblemUnsupportedMediaType  = "unsupported_media_type"
	ProblemRateLimited           = "rate_limited"
	ProblemMethodNotAllowed      = "method_not_allowed"
	ProblemNotFound              = "not_found"
	ProblemCallbackRefused       = "callback_refused"
	ProblemIneligibleApprover    = "ineligible_approver"
	ProblemAlreadyDecided        = "already_decided"
	// ProblemApprovalAlreadyUsed: a revocation of an approval a
	// re-evaluation has already allowed a call with.
	ProblemApprovalAlreadyUsed = "approval_already_used"
	// ProblemPolicyInvalid: a policy reload refused, the running one kept.
	ProblemPolicyInvalid = "policy_invalid"
	// ProblemChannelNotAllowed: the rule does not take decisions through the
	// channel this one came by (approval.channels).
	ProblemChannelNotAllowed = "channel_not_allowed"
	// ProblemSignatureRequired: the rule requires a decision signed with the
	// approver's passkey (approval.require_passkey), and this one is not
	// (it came through a channel that cannot carry a signature, or carries
	// none, or one that does not verify).
	ProblemSignatureRequired = "signature_required"
	// ProblemUnknownPerson: on_behalf_of names no active directory user.
	ProblemUnknownPerson = "unknown_person"
	ProblemInternal      = "internal_error"
	// ProblemUnavailable: the database is unavailable (stopped, restarting,
	// unreachable); retry after the seconds in Retry-After.
	ProblemUnavailable = "unavailable"
)

// ARAPProblems lists the codes the draft itself defines; they use
// ProblemPrefix, every other code uses LocalProblemPrefix.
var ARAPProblems = map[string]bool{
	ProblemNotRequestable: true, ProblemExpiredDenial: true, ProblemInvalidDenialBinding: true,
	ProblemDuplicateRequest: true, ProblemUnknownTask: true, ProblemTaskExpired: true,
	ProblemInvalidTaskState: true,
}

// ProblemType returns the RFC 9457 type URI for a problem code.
func ProblemType(code string) string {
	if ARAPProblems[code] {
		return ProblemPrefix + code
	}
	return LocalProblemPrefix + code
}

// DisplayStatusReason is our private (reverse-DNS) member of task.display that
// says why a task ended, e.g. "timeout" for expiry, never a person's name.
const DisplayStatusReason = "arap.omcp.dev/status_reason"

// JWT claim names of binding_token and approval.state.
const (
	ClaimEvaluationID          = "evaluation_id"
	ClaimDenialExpiresAt       = "denial_expires_at"
	ClaimBindingContextMembers = "binding_context_members"
	ClaimBindingHash           = "binding_hash"
	ClaimTemplate              = "template"
	ClaimApprovalID            = "approval_id"
	ClaimApprovedUntil         = "approved_until"
	ClaimRequestID             = "request_id"
)

// Search APIs (AuthZEN 1.0 section 8): default paths, and the kinds of
// search, each naming the member it enumerates.
const (
	PathSearchSubject  = "/access/v1/search/subject"
	PathSearchResource = "/access/v1/search/resource"
	PathSearchAction   = "/access/v1/search/action"

	SearchSubject  = "subject"
	SearchResource = "resource"
	SearchAction   = "action"
)
