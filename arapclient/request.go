package arapclient

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"time"

	"github.com/omcp/arap/authzen"
)

// AccessRequest is a requestable denial: the PDP said no, but access can be
// asked for until ExpiresAt. It carries what a submission must bind to (the
// signed binding token, the evaluation id) and the evaluation it answered,
// so that Submit sends exactly the denied call. Get one from Requestable.
type AccessRequest struct {
	// BindingToken is the PDP's signed binding of the denial to the call;
	// the service refuses a submission that does not match it.
	BindingToken string
	// ExpiresAt is when the offer ends (submit before it).
	ExpiresAt time.Time
	// RequestSchemaURL, when set, is the JSON Schema of what the submission
	// must add (SubmitOptions.Context, RequestedAccess), e.g. a business
	// justification; fetch it with Client.Schema.
	RequestSchemaURL string
	// Display holds hints for people (title, description).
	Display map[string]any
	// Template is the opaque routing id of the rule.
	Template string
	// Endpoint is where to submit ("" for the service's default).
	Endpoint string
	// EvaluationID, EvaluatedAt and Reason come from the decision context.
	EvaluationID string
	EvaluatedAt  *time.Time
	Reason       string
	// Call is the denied evaluation request.
	Call authzen.EvaluationRequest
}

// Requestable returns the access request a decision offers for call: ok is
// false for an allow and for a denial that cannot be requested.
func Requestable(call authzen.EvaluationRequest, d authzen.Decision) (*AccessRequest, bool) {
	h, ok := d.AccessRequest()
	if !ok {
		return nil, false
	}
	ar := &AccessRequest{
		BindingToken: h.BindingToken, ExpiresAt: h.ExpiresAt, RequestSchemaURL: h.RequestSchemaURL,
		Display: h.Display, Template: h.Template, Endpoint: h.Endpoint,
		EvaluationID: d.Context.Str(authzen.CtxEvaluationID), Reason: d.Context.Str(authzen.CtxReason), Call: call,
	}
	if at, err := time.Parse(time.RFC3339, d.Context.Str(authzen.CtxEvaluatedAt)); err == nil {
		ar.EvaluatedAt = &at
	}
	return ar, true
}

// SubmitOptions are what a submission adds to the denied call.
type SubmitOptions struct {
	// IdempotencyKey identifies the submission: a retry with the same key
	// and body returns the same task. Empty: a fresh random key.
	IdempotencyKey string
	// Context members to add to the call's context (those the request
	// schema asks for, such as business_justification).
	Context authzen.Object
	// RequestedAccess narrows or describes what is asked for.
	RequestedAccess authzen.Object
	// Client describes the requesting application (audit and routing).
	Client *authzen.ClientInfo
	// Callback asks the service to call an endpoint (of the client's
	// allow-list) when the request ends; see Callbacks.
	Callback *authzen.Callback
}

// ErrDenialExpired: the access request's offer ended before Submit.
var ErrDenialExpired = errors.New("arapclient: the requestable denial has expired; evaluate again")

// Submit asks for the access a requestable denial offers: the denied call,
// bound to the denial, with what opts add. It returns the task handle
// (status pending, or approved at once by an automated rule).
func (c *Client) Submit(ctx context.Context, ar *AccessRequest, opts SubmitOptions) (authzen.TaskResponse, error) {
	if ar == nil || ar.BindingToken == "" {
		return authzen.TaskResponse{}, errors.New("arapclient: submit needs a requestable denial (see Requestable)")
	}
	if !ar.ExpiresAt.IsZero() && !time.Now().Before(ar.ExpiresAt) {
		return authzen.TaskResponse{}, ErrDenialExpired
	}
	exp := ar.ExpiresAt
	sub := authzen.Submission{
		Subject: ar.Call.Subject, Resource: ar.Call.Resource, Action: ar.Call.Action, Context: ar.Call.Context,
		Denial: &authzen.Denial{
			EvaluationID: ar.EvaluationID, EvaluatedAt: ar.EvaluatedAt, ExpiresAt: &exp,
			Reason: ar.Reason, BindingToken: ar.BindingToken, Template: ar.Template,
		},
		RequestedAccess: opts.RequestedAccess, Client: opts.Client, Callback: opts.Callback,
	}
	if len(opts.Context) > 0 {
		sub.Context = authzen.Object{}
		maps.Copy(sub.Context, ar.Call.Context)
		maps.Copy(sub.Context, opts.Context)
	}
	body, err := json.Marshal(sub)
	if err != nil {
		return authzen.TaskResponse{}, err
	}
	key := opts.IdempotencyKey
	if key == "" {
		key = rand.Text()
	}
	endpoint := ar.Endpoint
	if endpoint == "" {
		endpoint = c.url(authzen.PathRequests)
	}
	var tr authzen.TaskResponse
	_, err = c.do(ctx, http.MethodPost, endpoint, body, http.Header{authzen.HeaderIdempotencyKey: {key}}, &tr)
	return tr, err
}

// ErrNoApproval: Reevaluate was given a task without an approval (one not
// approved, or read from anything but its status endpoint).
var ErrNoApproval = errors.New("arapclient: the task carries no approval; only an approved task's status has one")

// Reevaluate asks the PDP again for call, presenting the approval of an
// approved task (context.approval). Only its allow lets the action run:
// the approval may have expired, been revoked, or not cover the call. A
// denial's context.next_action says what to do then: "retry" later (the
// grant is not in effect yet; context.retry_after), "request" again, or
// "none".
func (c *Client) Reevaluate(ctx context.Context, call authzen.EvaluationRequest, approved authzen.TaskResponse) (authzen.Decision, error) {
	if approved.Result == nil || approved.Result.Approval == nil {
		return authzen.Decision{}, ErrNoApproval
	}
	req := call
	req.Context = authzen.Object{}
	maps.Copy(req.Context, call.Context)
	req.Context[authzen.CtxApproval] = approved.Result.Approval
	return c.Evaluate(ctx, req)
}
