package arapclient

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/omcp/arap/authzen"
)

// The decision API: resolvers (ITSM systems, supervising agents, risk
// engines) list requests they may decide, read one, and decide it; admins
// revoke approvals. A token with scope decide (or admin).

// RequestView is a request as deciders see it (GET /v1/requests/{id}): what
// is asked, by whom, under which rule, and how far the decision has got.
type RequestView struct {
	ID           string         `json:"id"`
	Status       string         `json:"status"`
	StatusReason string         `json:"status_reason,omitempty"`
	Rule         string         `json:"rule"`
	Subject      authzen.Object `json:"subject"`
	Action       authzen.Object `json:"action"`
	Resource     authzen.Object `json:"resource"`
	// Context holds the context members the rule declared; ExtraContext the
	// others the requester added (not asked for, not checked). Both are the
	// requester's statements, not facts.
	Context         authzen.Object      `json:"context,omitempty"`
	ExtraContext    authzen.Object      `json:"extra_context,omitempty"`
	RequestedAccess authzen.Object      `json:"requested_access,omitempty"`
	Client          *authzen.ClientInfo `json:"client,omitempty"`
	SubmittedBy     string              `json:"submitted_by"`
	Display         map[string]any      `json:"display,omitempty"`
	CreatedAt       time.Time           `json:"created_at"`
	ExpiresAt       time.Time           `json:"expires_at"`
	EndedAt         *time.Time          `json:"ended_at,omitempty"`
	// ApprovalPolicy is the rule's approval block (quorum, groups, kinds,
	// channels, ...), kept as sent so that new members reach the caller.
	ApprovalPolicy authzen.Object   `json:"approval_policy"`
	Votes          []Vote           `json:"votes"`
	Progress       Progress         `json:"progress"`
	Approval       *ApprovalSummary `json:"approval,omitempty"`
	// YouMayDecide says whether the caller may vote now, and Why not.
	YouMayDecide bool   `json:"you_may_decide"`
	Why          string `json:"why_not,omitempty"`
	// HiddenCharacters lists the characters of the view a person could not
	// see or could mistake (HiddenOmitted counts those past the list).
	HiddenCharacters []HiddenCharacter `json:"hidden_characters,omitempty"`
	HiddenOmitted    int               `json:"hidden_characters_omitted,omitempty"`
}

// Vote is one decision on a request.
type Vote struct {
	Voter         string     `json:"voter"`
	Kind          string     `json:"kind"`
	Decision      string     `json:"decision"`
	Reason        string     `json:"reason,omitempty"`
	ApprovedUntil *time.Time `json:"approved_until,omitempty"`
	At            time.Time  `json:"at"`
	// Channel is how the vote came (web, api, on_behalf, slack); Via the
	// client that recorded a person's vote.
	Channel string `json:"channel,omitempty"`
	Via     *Via   `json:"via,omitempty"`
}

// Via is the client that recorded a vote on a person's behalf.
type Via struct {
	ClientID string `json:"client_id"`
	Client   string `json:"client"`
	Kind     string `json:"kind"`
}

// Progress counts approvals toward the quorum.
type Progress struct {
	Approvals      int `json:"approvals"`
	Quorum         int `json:"quorum"`
	HumanApprovals int `json:"human_approvals"`
	RequireHumans  int `json:"require_humans"`
}

// ApprovalSummary is the issued approval without its signed state.
type ApprovalSummary struct {
	ID            string    `json:"id"`
	ApprovedAt    time.Time `json:"approved_at"`
	ApprovedUntil time.Time `json:"approved_until"`
}

// HiddenCharacter is one character of a view a person could not see or
// could mistake, located by JSON Pointer and byte offset.
type HiddenCharacter struct {
	Pointer string `json:"pointer"`
	InName  bool   `json:"in_name,omitempty"`
	Offset  int    `json:"offset"`
	Size    int    `json:"size"`
	Code    string `json:"code"`
	Name    string `json:"name"`
	Why     string `json:"why"`
}

// RequestList is a page of requests.
type RequestList struct {
	Requests   []RequestView `json:"requests"`
	NextCursor string        `json:"next_cursor,omitempty"`
}

// ListOptions filter Requests.
type ListOptions struct {
	// Status filters by status ("" for all).
	Status string
	// Rule keeps the requests of one policy rule.
	Rule string
	// Limit is the page size (0: the service's default).
	Limit int
	// Cursor continues from a page's NextCursor.
	Cursor string
}

// Requests lists requests the caller may see, newest first.
func (c *Client) Requests(ctx context.Context, o ListOptions) (RequestList, error) {
	q := url.Values{}
	if o.Status != "" {
		q.Set("status", o.Status)
	}
	if o.Rule != "" {
		q.Set("rule", o.Rule)
	}
	if o.Limit > 0 {
		q.Set("limit", fmt.Sprint(o.Limit))
	}
	if o.Cursor != "" {
		q.Set("cursor", o.Cursor)
	}
	u := c.url("/v1/requests")
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var l RequestList
	_, err := c.call(ctx, http.MethodGet, u, nil, &l)
	return l, err
}

// Request reads one request.
func (c *Client) Request(ctx context.Context, id string) (RequestView, error) {
	var v RequestView
	_, err := c.call(ctx, http.MethodGet, c.url("/v1/requests/"+url.PathEscape(id)), nil, &v)
	return v, err
}

// Decisions.
const (
	DecisionApprove = "approve"
	DecisionDeny    = "deny"
)

// Decision is a vote on a request.
type Decision struct {
	// Decision is DecisionApprove or DecisionDeny.
	Decision string `json:"decision"`
	// Reason is recorded with the decision (and shown in the audit trail).
	Reason string `json:"reason"`
	// ApprovedUntil asks for an approval ending then, within what the rule
	// allows; nil for the rule's default.
	ApprovedUntil *time.Time `json:"approved_until"`
	// OnBehalfOf, with scope decide_for_people, records the decision as
	// this directory user; their eligibility applies.
	OnBehalfOf *string `json:"on_behalf_of,omitempty"`
}

// Decide records a decision on request id and returns the request after it.
func (c *Client) Decide(ctx context.Context, id string, d Decision) (RequestView, error) {
	var v RequestView
	_, err := c.call(ctx, http.MethodPost, c.url("/v1/requests/"+url.PathEscape(id)+"/decisions"), d, &v)
	return v, err
}

// RevokedApproval is the answer to Revoke.
type RevokedApproval struct {
	ID        string `json:"id"`
	RequestID string `json:"request_id"`
	Status    string `json:"status"`
}

// Revoke revokes an approval: re-evaluations presenting it are denied from
// now on. An approval a re-evaluation has already used (allowed a call
// with) is not revoked: the problem is approval_already_used, with when
// (used_at) and by which evaluation (evaluation_id).
func (c *Client) Revoke(ctx context.Context, approvalID, reason string) (RevokedApproval, error) {
	var out RevokedApproval
	_, err := c.call(ctx, http.MethodPost, c.url("/v1/approvals/"+url.PathEscape(approvalID)+"/revoke"), map[string]string{"reason": reason}, &out)
	return out, err
}

// Delivery is one callback delivery of a request, with every attempt.
type Delivery struct {
	ID            string     `json:"id"`
	RequestID     string     `json:"request_id"`
	Endpoint      string     `json:"endpoint"`
	Event         string     `json:"event"`
	Status        string     `json:"status"`
	Attempts      []Attempt  `json:"attempts"`
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
	CreatedAt     time.Time  `json:"created_at"`
}

// Attempt is one try of a delivery.
type Attempt struct {
	At         time.Time `json:"at"`
	StatusCode *int      `json:"status_code,omitempty"`
	LatencyMS  float64   `json:"latency_ms"`
	Error      string    `json:"error,omitempty"`
}

// Deliveries lists the callback deliveries of a request the caller
// submitted (or any, for an admin).
func (c *Client) Deliveries(ctx context.Context, requestID string) ([]Delivery, error) {
	var out struct {
		Deliveries []Delivery `json:"deliveries"`
	}
	_, err := c.call(ctx, http.MethodGet, c.url("/v1/requests/"+url.PathEscape(requestID)+"/deliveries"), nil, &out)
	return out.Deliveries, err
}

// Redeliver sends a delivery again.
func (c *Client) Redeliver(ctx context.Context, requestID, deliveryID string) error {
	_, err := c.call(ctx, http.MethodPost, c.url("/v1/requests/"+url.PathEscape(requestID)+"/deliveries/"+url.PathEscape(deliveryID)+"/redeliver"), nil, nil)
	return err
}

// PolicyReload is what a policy reload loaded.
type PolicyReload struct {
	Policy    string `json:"policy"`
	Rules     int    `json:"rules"`
	Announced bool   `json:"announced"`
}

// ReloadPolicy has the backend reload its policy file, on every replica
// (scope admin). A file with errors is refused, problem policy_invalid
// listing each as FILE:LINE: reason, and the running policy stays.
func (c *Client) ReloadPolicy(ctx context.Context) (PolicyReload, error) {
	var out PolicyReload
	_, err := c.call(ctx, http.MethodPost, c.url("/v1/admin/policy/reload"), nil, &out)
	return out, err
}
