// Package authzen holds the wire types of the OpenID AuthZEN Authorization API
// 1.0 and its Access Request and Approval Profile (ARAP), the binding_hash
// construction, and the names the drafts use. The PDP, the Access Request
// Service and the PEP all speak through these types.
package authzen

import (
	"encoding/json"
	"time"
)

// Object is a JSON object kept exactly as received. Subjects, resources,
// actions and contexts stay whole so that binding and approval-scope
// comparisons see precisely what the PEP sent, properties included.
type Object map[string]any

// Str returns the string member key, or "" when it is absent or not a string.
func (o Object) Str(key string) string {
	s, _ := o[key].(string)
	return s
}

// Obj returns the object member key, or nil.
func (o Object) Obj(key string) Object {
	m, _ := o[key].(map[string]any)
	return m
}

// EvaluationRequest is an Access Evaluation request (AuthZEN 1.0 section 6.1).
type EvaluationRequest struct {
	Subject  Object `json:"subject"`
	Resource Object `json:"resource"`
	Action   Object `json:"action"`
	Context  Object `json:"context,omitempty"`
}

// EvaluationsRequest is a batch request: top-level members are defaults that
// each item may replace.
type EvaluationsRequest struct {
	Subject     Object              `json:"subject,omitempty"`
	Resource    Object              `json:"resource,omitempty"`
	Action      Object              `json:"action,omitempty"`
	Context     Object              `json:"context,omitempty"`
	Evaluations []EvaluationRequest `json:"evaluations,omitempty"`
	Options     struct {
		EvaluationsSemantic string `json:"evaluations_semantic,omitempty"`
	} `json:"options,omitzero"`
}

// Decision is an Access Evaluation response.
type Decision struct {
	Decision bool   `json:"decision"`
	Context  Object `json:"context,omitempty"`
}

// EvaluationsResponse answers a batch.
type EvaluationsResponse struct {
	Evaluations []Decision `json:"evaluations"`
}

// AccessRequestHint is context.access_request of a requestable denial.
type AccessRequestHint struct {
	Endpoint         string         `json:"endpoint,omitempty"`
	Template         string         `json:"template,omitempty"`
	ExpiresAt        time.Time      `json:"expires_at"`
	BindingToken     string         `json:"binding_token,omitempty"`
	Display          map[string]any `json:"display,omitempty"`
	FormURL          string         `json:"form_url,omitempty"`
	RequestSchemaURL string         `json:"request_schema_url,omitempty"`
}

// Metadata is the PDP discovery document.
type Metadata struct {
	PolicyDecisionPoint       string   `json:"policy_decision_point"`
	AccessEvaluationEndpoint  string   `json:"access_evaluation_endpoint"`
	AccessEvaluationsEndpoint string   `json:"access_evaluations_endpoint,omitempty"`
	AccessRequestEndpoint     string   `json:"access_request_endpoint,omitempty"`
	SearchSubjectEndpoint     string   `json:"search_subject_endpoint,omitempty"`
	SearchResourceEndpoint    string   `json:"search_resource_endpoint,omitempty"`
	SearchActionEndpoint      string   `json:"search_action_endpoint,omitempty"`
	JWKSURI                   string   `json:"jwks_uri,omitempty"`
	Capabilities              []string `json:"capabilities,omitempty"`
}

// Submission is an Access Request (ARAP section 3.3), single-item form.
type Submission struct {
	Subject         Object      `json:"subject"`
	Resource        Object      `json:"resource,omitempty"`
	Action          Object      `json:"action,omitempty"`
	Items           []any       `json:"items,omitempty"`
	Context         Object      `json:"context,omitempty"`
	Denial          *Denial     `json:"denial,omitempty"`
	RequestedAccess Object      `json:"requested_access,omitempty"`
	Client          *ClientInfo `json:"client,omitempty"`
	Callback        *Callback   `json:"callback,omitempty"`
}

// SubmissionMembers lists the top-level members a submission may carry; the
// top level is not an ARAP extension point, so anything else is refused.
var SubmissionMembers = []string{"subject", "resource", "action", "items", "context", "denial", "requested_access", "client", "callback"}

// Denial binds a submission to the denied evaluation.
type Denial struct {
	EvaluationID string     `json:"evaluation_id,omitempty"`
	EvaluatedAt  *time.Time `json:"evaluated_at,omitempty"`
	ExpiresAt    *time.Time `json:"expires_at,omitempty"`
	Reason       string     `json:"reason,omitempty"`
	BindingToken string     `json:"binding_token,omitempty"`
	Template     string     `json:"template,omitempty"`
}

// DenialMembers lists the members of the denial object.
var DenialMembers = []string{"evaluation_id", "evaluated_at", "expires_at", "reason", "binding_token", "template"}

// ClientInfo is the submission's client object (audit and routing only).
type ClientInfo struct {
	ID     string         `json:"id,omitempty"`
	Name   string         `json:"name,omitempty"`
	Actor  Object         `json:"actor,omitempty"`
	Source map[string]any `json:"source,omitempty"`
}

// Callback asks the ARS to notify an endpoint on terminal events.
type Callback struct {
	Endpoint string   `json:"endpoint"`
	State    string   `json:"state,omitempty"`
	Events   []string `json:"events,omitempty"`
}

// Task is the ARAP Task Handle.
type Task struct {
	ID             string         `json:"id"`
	Status         string         `json:"status"`
	StatusEndpoint string         `json:"status_endpoint"`
	ExpiresAt      *time.Time     `json:"expires_at,omitempty"`
	Display        map[string]any `json:"display,omitempty"`
	Links          map[string]any `json:"links,omitempty"`
}

// TaskResponse is the body of submit, status and cancel responses.
type TaskResponse struct {
	Task   Task    `json:"task"`
	Result *Result `json:"result,omitempty"`
}

// Result is a completion result.
type Result struct {
	Mode     string    `json:"mode"`
	Approval *Approval `json:"approval,omitempty"`
}

// Approval is the approval object carried back at context.approval.
type Approval struct {
	ID            string    `json:"id"`
	ApprovedAt    time.Time `json:"approved_at,omitzero"`
	ApprovedUntil time.Time `json:"approved_until"`
	State         string    `json:"state,omitempty"`
}

// Problem is an RFC 9457 problem document.
type Problem struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
	// Errors lists individual violations (schema validation), when any.
	Errors []string `json:"errors,omitempty"`
	// UsedAt and EvaluationID say when and by which re-evaluation an
	// approval was used (approval_already_used).
	UsedAt       *time.Time `json:"used_at,omitempty"`
	EvaluationID string     `json:"evaluation_id,omitempty"`
}

// ProblemContentType is the media type of Problem documents.
const ProblemContentType = "application/problem+json"

// CacheHint is context[CtxCache] of an allowed decision that may be reused.
type CacheHint struct {
	// MaxAge bounds the reuse, in seconds from the evaluation.
	MaxAge int `json:"max_age"`
}

// Cacheable says for how long the decision may be reused (CtxCache): zero
// unless it is an allow that carries a well-formed hint.
func (d Decision) Cacheable() time.Duration {
	raw, ok := d.Context[CtxCache]
	if !ok || !d.Decision {
		return 0
	}
	h, ok := raw.(CacheHint)
	if !ok {
		var err error
		if h, err = Convert[CacheHint](raw); err != nil {
			return 0
		}
	}
	// At most a day: a longer reuse is no reuse a PEP should make.
	return time.Duration(min(max(h.MaxAge, 0), 86400)) * time.Second
}

// AccessRequest returns the requestable-denial hint of a decision received
// over the wire, if there is one.
func (d Decision) AccessRequest() (*AccessRequestHint, bool) {
	raw, ok := d.Context[CtxAccessRequest]
	if !ok || d.Decision {
		return nil, false
	}
	if h, ok := raw.(AccessRequestHint); ok {
		return &h, true
	}
	h, err := Convert[AccessRequestHint](raw)
	if err != nil || h.ExpiresAt.IsZero() {
		return nil, false
	}
	return &h, true
}

// Convert converts a value (typically decoded JSON) into T through encoding/json.
func Convert[T any](v any) (T, error) {
	var out T
	b, err := json.Marshal(v)
	if err != nil {
		return out, err
	}
	err = json.Unmarshal(b, &out)
	return out, err
}
