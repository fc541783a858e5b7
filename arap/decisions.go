package arap

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/directory"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/identity"
	"github.com/omcp/arap/internal/visible"
	"github.com/omcp/arap/requests"
)

// RequestView is a request as deciders see it (GET /v1/requests/{id}): what
// is asked, by whom, for whom, under which rule, and how far the decision
// has got. Unlike the PEP's task handle it shows arguments and votes, and
// never the approval's signed state.
type RequestView struct {
	ID           string         `json:"id"`
	Status       string         `json:"status"`
	StatusReason string         `json:"status_reason,omitempty"`
	Rule         string         `json:"rule"`
	Subject      authzen.Object `json:"subject"`
	Action       authzen.Object `json:"action"`
	Resource     authzen.Object `json:"resource"`
	// Context holds the context members the rule declared (asked for in its
	// request_schema, or bound by context_members); ExtraContext the others
	// the requester added: not asked for and not checked. Both are the
	// requester's statements, not facts.
	Context         authzen.Object            `json:"context,omitempty"`
	ExtraContext    authzen.Object            `json:"extra_context,omitempty"`
	RequestedAccess authzen.Object            `json:"requested_access,omitempty"`
	Client          *authzen.ClientInfo       `json:"client,omitempty"`
	SubmittedBy     string                    `json:"submitted_by"`
	Display         map[string]any            `json:"display,omitempty"`
	CreatedAt       time.Time                 `json:"created_at"`
	ExpiresAt       time.Time                 `json:"expires_at"`
	EndedAt         *time.Time                `json:"ended_at,omitempty"`
	ApprovalPolicy  evaluation.ApprovalPolicy `json:"approval_policy"`
	Votes           []requests.Vote           `json:"votes"`
	Progress        Progress                  `json:"progress"`
	Approval        *ApprovalSummary          `json:"approval,omitempty"`
	// YouMayDecide says whether the caller may vote now, and Why not.
	YouMayDecide bool   `json:"you_may_decide"`
	Why          string `json:"why_not,omitempty"`
	// HiddenCharacters lists every character of the view above that a
	// person could not see or could mistake (at most MaxHiddenListed;
	// HiddenOmitted counts the rest), so an ITSM system or a console can
	// show markers instead of the characters.
	HiddenCharacters []HiddenCharacter `json:"hidden_characters,omitempty"`
	HiddenOmitted    int               `json:"hidden_characters_omitted,omitempty"`
}

// HiddenCharacter is one character of a request view that a person could
// not see (a control, bidirectional formatting, a zero-width or other
// default-ignorable character, a private-use or unassigned code point, a
// space other than U+0020, a byte that is not UTF-8) or could mistake (a
// letter of another script inside a word).
type HiddenCharacter struct {
	// Pointer is the JSON Pointer (RFC 6901) of the string in the view.
	Pointer string `json:"pointer"`
	// InName is true when the character is in the member name that
	// Pointer ends with, not in its value.
	InName bool `json:"in_name,omitempty"`
	// Offset and Size locate it in that string, in bytes of UTF-8.
	Offset int `json:"offset"`
	Size   int `json:"size"`
	// Code is "U+202E" ("0xFF" for a byte that is not UTF-8); Name the
	// Unicode name; Why the class.
	Code string `json:"code"`
	Name string `json:"name"`
	Why  string `json:"why"`
}

// MaxHiddenListed bounds HiddenCharacters in one view.
const MaxHiddenListed = 100

// findHidden lists the hidden characters of a view, found in its JSON form
// so that the pointers are exactly the view's.
func findHidden(v RequestView) ([]HiddenCharacter, int) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, 0
	}
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, 0
	}
	found := visible.ScanValue(doc)
	var out []HiddenCharacter
	for _, l := range found {
		if len(out) == MaxHiddenListed {
			break
		}
		out = append(out, HiddenCharacter{Pointer: l.Pointer(""), InName: l.InName, Offset: l.Offset, Size: l.Size,
			Code: l.Code, Name: l.Name, Why: l.Why})
	}
	return out, len(found) - len(out)
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

// ListResponse is a page of requests.
type ListResponse struct {
	Requests   []RequestView `json:"requests"`
	NextCursor string        `json:"next_cursor,omitempty"`
}

// DecisionBody is the body of POST /v1/requests/{id}/decisions.
type DecisionBody struct {
	Decision      string     `json:"decision"`
	Reason        string     `json:"reason"`
	ApprovedUntil *time.Time `json:"approved_until"`
	// OnBehalfOf, with the decide_for_people scope, is the directory user
	// name of the person the decision is recorded for; absent or null, the
	// client decides as itself.
	OnBehalfOf *string `json:"on_behalf_of,omitempty"`
}

// voter is the API client as a decider; admins list everything.
func voter(c *clients.Client) requests.Voter { return requests.ClientVoter(c.ID, c.Name, c.Kind) }

// View renders r for v (nil: an admin looking), with votes.
func View(r *requests.Request, votes []requests.Vote, v *requests.Voter, now time.Time) RequestView {
	out := RequestView{
		ID: r.ID, Status: string(r.Status), StatusReason: r.StatusReason, Rule: r.Rule, Subject: r.Subject, Action: r.Action,
		Resource: r.Resource, RequestedAccess: r.RequestedAccess, Client: r.ClientInfo, SubmittedBy: r.ClientID,
		Display: r.Display, CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt, EndedAt: r.TerminalAt, ApprovalPolicy: r.ApprovalPolicy,
		Votes: votes, Progress: Progress{Quorum: r.ApprovalPolicy.Quorum, RequireHumans: r.ApprovalPolicy.RequireHumans},
	}
	if out.Votes == nil {
		out.Votes = []requests.Vote{}
	}
	for _, vt := range votes {
		if vt.Decision == evaluation.DecisionApprove {
			out.Progress.Approvals++
			if vt.Kind == "human" {
				out.Progress.HumanApprovals++
			}
		}
	}
	if r.Result != nil && r.Result.Approval != nil {
		a := r.Result.Approval
		out.Approval = &ApprovalSummary{ID: a.ID, ApprovedAt: a.ApprovedAt, ApprovedUntil: a.ApprovedUntil}
	}
	if v != nil {
		out.YouMayDecide, out.Why = requests.MayDecide(*v, r, votes, now)
	}
	out.Context, out.ExtraContext = r.SplitContext()
	out.HiddenCharacters, out.HiddenOmitted = findHidden(out)
	return out
}

// visibleTo returns the voter to filter by, nil for admins.
func visibleTo(c *clients.Client) *requests.Voter {
	if c.Has(clients.ScopeAdmin) {
		return nil
	}
	v := voter(c)
	return &v
}

func (s *Server) listRequests(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := 0
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 {
			writeProblem(w, r, authzen.ProblemInvalidRequest, "limit must be a positive integer", nil)
			return
		}
		limit = n
	}
	status := q.Get("status")
	if status != "" && !validStatus(status) {
		writeProblem(w, r, authzen.ProblemInvalidRequest, "status must be one of pending, approved, denied, expired, cancelled, failed", nil)
		return
	}
	c := clientFrom(r)
	v := visibleTo(c)
	list, next, err := s.d.Requests.List(r.Context(), v, requests.ListOptions{
		Status: requests.Status(status), Rule: q.Get("rule"), Limit: limit, Cursor: q.Get("cursor"),
	})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	resp := ListResponse{Requests: make([]RequestView, 0, len(list)), NextCursor: next}
	votes, err := s.d.Requests.VotesOf(r.Context(), list)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	now := time.Now()
	for _, req := range list {
		resp.Requests = append(resp.Requests, View(req, votes[req.ID], v, now))
	}
	writeJSON(w, http.StatusOK, resp)
}

func validStatus(s string) bool {
	for _, st := range requests.AllStatuses {
		if string(st) == s {
			return true
		}
	}
	return false
}

// loadForDecider loads request id if the caller is one of its named deciders
// (or an admin); others get 404, as if it did not exist.
func (s *Server) loadForDecider(w http.ResponseWriter, r *http.Request) (*requests.Request, *requests.Voter, bool) {
	c := clientFrom(r)
	req, err := s.d.Requests.Load(r.Context(), chi.URLParam(r, "id"))
	if err != nil {
		s.fail(w, r, err)
		return nil, nil, false
	}
	v := visibleTo(c)
	if v != nil && !requests.Names(*v, req) {
		writeProblem(w, r, authzen.ProblemUnknownTask, "no access request with this id is visible to this client", nil)
		return nil, nil, false
	}
	return req, v, true
}

func (s *Server) showRequest(w http.ResponseWriter, r *http.Request) {
	req, v, ok := s.loadForDecider(w, r)
	if !ok {
		return
	}
	votes, err := s.d.Requests.Votes(r.Context(), req.ID)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, View(req, votes, v, time.Now()))
}

func (s *Server) decide(w http.ResponseWriter, r *http.Request) {
	body, berr := readBody(w, r, s.d.Limits.MaxBody, false)
	if berr != nil {
		writeProblem(w, r, berr.code, berr.detail, nil)
		return
	}
	var d DecisionBody
	if err := decodeJSON(body, &d); err != nil {
		writeProblem(w, r, authzen.ProblemInvalidRequest, err.Error(), nil)
		return
	}
	if d.Decision != evaluation.DecisionApprove && d.Decision != evaluation.DecisionDeny {
		writeProblem(w, r, authzen.ProblemInvalidRequest, `decision must be "approve" or "deny"`, nil)
		return
	}
	c := clientFrom(r)
	v := voter(c)
	if d.OnBehalfOf != nil {
		person, ok := s.person(w, r, c, *d.OnBehalfOf)
		if !ok {
			return
		}
		// Whether the request names the person, and may be decided by them
		// through this client, is the person's eligibility, checked with
		// the vote; the client's own visibility does not come into it.
		v = person
	} else if _, _, ok := s.loadForDecider(w, r); !ok {
		return
	}
	id := chi.URLParam(r, "id")
	req, err := s.d.Requests.Decide(r.Context(), v, id, requests.Decision{
		Approve: d.Decision == evaluation.DecisionApprove, Reason: d.Reason, ApprovedUntil: d.ApprovedUntil,
	})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	votes, err := s.d.Requests.Votes(r.Context(), id)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, View(req, votes, &v, time.Now()))
}

// person is the voter for a decision client c records on name's behalf: the
// directory's user (groups and identities from the directory, never from
// the client), through c. It answers the refusal itself when there is none:
// 403 without the decide_for_people scope, 422 for a name that is no active
// directory user.
func (s *Server) person(w http.ResponseWriter, r *http.Request, c *clients.Client, name string) (requests.Voter, bool) {
	if !c.Has(clients.ScopeDecideForPeople) {
		w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="arap", error="insufficient_scope", scope=%q`, clients.ScopeDecideForPeople))
		writeProblem(w, r, authzen.ProblemInsufficientScope,
			fmt.Sprintf("client %q lacks the %s scope that on_behalf_of needs", c.Name, clients.ScopeDecideForPeople), nil)
		return requests.Voter{}, false
	}
	if err := identity.Check(name); err != nil {
		writeProblem(w, r, authzen.ProblemInvalidRequest, "on_behalf_of "+err.Error(), nil)
		return requests.Voter{}, false
	}
	if s.d.People == nil {
		writeProblem(w, r, authzen.ProblemUnknownPerson, "this server has no directory to find on_behalf_of in", nil)
		return requests.Voter{}, false
	}
	var u *directory.User
	err := directory.ErrNotFound
	if directory.ValidName(name) {
		u, err = s.d.People.User(r.Context(), name)
	}
	switch {
	case errors.Is(err, directory.ErrNotFound):
		writeProblem(w, r, authzen.ProblemUnknownPerson, fmt.Sprintf("on_behalf_of: no directory user is named %q", name), nil)
		return requests.Voter{}, false
	case err != nil:
		s.internal(w, r, err)
		return requests.Voter{}, false
	case u.DisabledAt != nil:
		writeProblem(w, r, authzen.ProblemUnknownPerson, fmt.Sprintf("on_behalf_of: directory user %q is disabled and may not decide", name), nil)
		return requests.Voter{}, false
	}
	return requests.OnBehalf(requests.UserVoter(u.Name, u.Identities(), u.Groups), c.ID, c.Name, c.Kind), true
}

// RevokeBody is the body of POST /v1/approvals/{id}/revoke.
type RevokeBody struct {
	Reason string `json:"reason"`
}

func (s *Server) revokeApproval(w http.ResponseWriter, r *http.Request) {
	body, berr := readBody(w, r, s.d.Limits.MaxBody, true)
	if berr != nil {
		writeProblem(w, r, berr.code, berr.detail, nil)
		return
	}
	var rb RevokeBody
	if body != nil {
		if err := decodeJSON(body, &rb); err != nil {
			writeProblem(w, r, authzen.ProblemInvalidRequest, err.Error(), nil)
			return
		}
	}
	c := clientFrom(r)
	v := voter(c)
	if c.Has(clients.ScopeAdmin) {
		v = requests.Voter{ID: "system"}
	}
	a, err := s.d.Requests.Revoke(r.Context(), v, chi.URLParam(r, "id"), rb.Reason)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": a.ID, "request_id": a.RequestID, "status": a.Status})
}
