package arap

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/directory"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/signing"
)

// The AuthZEN search APIs (1.0 section 8): which subjects may do an action
// on a resource, which resources a subject may act on, which actions a
// subject may take on a resource. Each candidate is decided by the PDP's
// evaluation, and only allows are results: a requestable denial needs an
// approval first, so it is not one. The candidates are, for subjects, the
// directory's active users (subject type "user"; none for other types); for
// resources, the resource ids the policy's rules name for that type; for
// actions, the action names the rules name (evaluation/search.go).
//
// Pages: results come in candidate order; page.next_token continues the
// same search (the same request but for page) by the same client for
// pageTokenTTL. It is a JWS signed with the PDP's keys, binding the kind of
// search, a hash of the request, the client and the position, so a client
// can neither forge one nor use one for another search.

// Page limits.
const (
	defaultPageLimit = 50
	maxPageLimit     = 100
	pageTokenTTL     = 15 * time.Minute
)

// userLister lists the directory's users: the candidates of a Subject Search.
type userLister interface {
	Users(ctx context.Context) ([]*directory.User, error)
}

// pageClaims are a page token's claims.
type pageClaims struct {
	jwt.RegisteredClaims
	Kind   string `json:"knd"`
	Query  string `json:"qh"`
	Client string `json:"azp"`
	Offset int    `json:"off"`
}

func (s *Server) searchSubject(w http.ResponseWriter, r *http.Request) {
	s.search(w, r, authzen.SearchSubject)
}

func (s *Server) searchResource(w http.ResponseWriter, r *http.Request) {
	s.search(w, r, authzen.SearchResource)
}

func (s *Server) searchAction(w http.ResponseWriter, r *http.Request) {
	s.search(w, r, authzen.SearchAction)
}

func (s *Server) search(w http.ResponseWriter, r *http.Request, kind string) {
	body, berr := readBody(w, r, s.d.Limits.MaxBody, false)
	if berr != nil {
		writeProblem(w, r, berr.code, berr.detail, nil)
		return
	}
	var req authzen.SearchRequest
	if err := decodeJSON(body, &req); err != nil {
		writeProblem(w, r, authzen.ProblemInvalidRequest, err.Error(), nil)
		return
	}
	if msg, v := validateSearch(kind, req); msg != "" {
		writeProblem(w, r, authzen.ProblemInvalidRequest, msg, v)
		return
	}
	limit := defaultPageLimit
	var token string
	if req.Page != nil {
		if req.Page.Limit < 0 || req.Page.Limit > maxPageLimit {
			writeProblem(w, r, authzen.ProblemInvalidRequest, fmt.Sprintf("page.limit must be between 1 and %d (absent or 0: %d)", maxPageLimit, defaultPageLimit), nil)
			return
		}
		if req.Page.Limit > 0 {
			limit = req.Page.Limit
		}
		token = req.Page.Token
	}
	query, err := searchHash(kind, req)
	if err != nil {
		writeProblem(w, r, authzen.ProblemInvalidRequest, err.Error(), nil)
		return
	}
	callerID := clientFrom(r).ID
	offset := 0
	if token != "" {
		if offset, err = s.readPageToken(r.Context(), token, kind, query, callerID); err != nil {
			writeProblem(w, r, authzen.ProblemInvalidRequest, err.Error(), nil)
			return
		}
	}
	candidates, err := s.searchCandidates(r.Context(), kind, req)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	resp := authzen.SearchResponse{Results: []authzen.Object{}}
	if offset < len(candidates) {
		allowed, next, err := s.d.Engine.SearchPage(r.Context(), callerID, candidates, offset, limit)
		if err != nil {
			s.internal(w, r, err)
			return
		}
		for _, i := range allowed {
			resp.Results = append(resp.Results, searchResult(kind, candidates[i]))
		}
		if next < len(candidates) {
			if resp.Page.NextToken, err = s.pageToken(r.Context(), kind, query, callerID, next); err != nil {
				s.internal(w, r, err)
				return
			}
		}
	}
	resp.Page.Count = len(resp.Results)
	writeJSON(w, http.StatusOK, resp)
}

// validateSearch checks a search request: the searched member is reduced
// to its type (subject, resource) or absent (action), the others are
// whole, no approval is presented, and the request an evaluation of one
// candidate would be is valid.
func validateSearch(kind string, req authzen.SearchRequest) (string, []string) {
	if _, ok := req.Context[authzen.CtxApproval]; ok {
		return "a search asks what is allowed now: context.approval is for re-evaluating one call", nil
	}
	probe := authzen.EvaluationRequest{Subject: req.Subject, Resource: req.Resource, Action: req.Action, Context: req.Context}
	switch kind {
	case authzen.SearchSubject:
		if _, ok := req.Subject["id"]; ok {
			return "a subject search enumerates subjects: give subject.type only, without subject.id", nil
		}
		probe.Subject = withID(req.Subject)
	case authzen.SearchResource:
		if _, ok := req.Resource["id"]; ok {
			return "a resource search enumerates resources: give resource.type only, without resource.id", nil
		}
		probe.Resource = withID(req.Resource)
	case authzen.SearchAction:
		if req.Action != nil {
			return "an action search enumerates actions: leave action out", nil
		}
		probe.Action = authzen.Object{"name": "search"}
	}
	if v := evaluation.ValidateRequest(probe); len(v) > 0 {
		return "the search request is malformed or names a non-canonical identity", v
	}
	return "", nil
}

// withID is o with a placeholder id, to validate what a candidate will be.
func withID(o authzen.Object) authzen.Object {
	if o == nil {
		return nil
	}
	c := maps.Clone(o)
	c["id"] = "search"
	return c
}

// searchHash identifies a search: its kind and its request but for page.
func searchHash(kind string, req authzen.SearchRequest) (string, error) {
	req.Page = nil
	b, err := authzen.Canonical(map[string]any{"kind": kind, "subject": req.Subject, "resource": req.Resource, "action": req.Action, "context": req.Context})
	if err != nil {
		return "", fmt.Errorf("the search request cannot be canonicalized: %w", err)
	}
	sum := sha256.Sum256(b)
	return base64.RawURLEncoding.EncodeToString(sum[:]), nil
}

// searchCandidates lists what a search decides, in a stable order.
func (s *Server) searchCandidates(ctx context.Context, kind string, req authzen.SearchRequest) ([]authzen.EvaluationRequest, error) {
	base := authzen.EvaluationRequest{Subject: req.Subject, Resource: req.Resource, Action: req.Action, Context: req.Context}
	var out []authzen.EvaluationRequest
	switch kind {
	case authzen.SearchSubject:
		lister, ok := s.d.People.(userLister)
		if !ok || req.Subject.Str("type") != "user" {
			return nil, nil
		}
		users, err := lister.Users(ctx)
		if err != nil {
			return nil, err
		}
		for _, u := range users {
			if u.DisabledAt != nil {
				continue
			}
			c := base
			c.Subject = maps.Clone(req.Subject)
			c.Subject["id"] = u.Name
			out = append(out, c)
		}
	case authzen.SearchResource:
		for _, id := range s.d.Engine.Policy().SearchResources(req.Resource.Str("type")) {
			c := base
			c.Resource = maps.Clone(req.Resource)
			c.Resource["id"] = id
			out = append(out, c)
		}
	case authzen.SearchAction:
		for _, name := range s.d.Engine.Policy().SearchActions() {
			c := base
			c.Action = authzen.Object{"name": name}
			out = append(out, c)
		}
	}
	return out, nil
}

// searchResult is what a search returns of an allowed candidate.
func searchResult(kind string, c authzen.EvaluationRequest) authzen.Object {
	switch kind {
	case authzen.SearchSubject:
		return authzen.Object{"type": c.Subject.Str("type"), "id": c.Subject.Str("id")}
	case authzen.SearchResource:
		return authzen.Object{"type": c.Resource.Str("type"), "id": c.Resource.Str("id")}
	default:
		return authzen.Object{"name": c.Action.Str("name")}
	}
}

// pageToken signs where a search goes on.
func (s *Server) pageToken(ctx context.Context, kind, query, callerID string, offset int) (string, error) {
	now := time.Now()
	return s.d.Keys.Sign(ctx, signing.TypePage, pageClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer: s.d.PublicURL, IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(now.Add(pageTokenTTL)),
		},
		Kind: kind, Query: query, Client: callerID, Offset: offset,
	})
}

// errPageToken prefixes every refusal of a page token.
var errPageToken = errors.New("page.token")

// readPageToken verifies a page token for this search and caller and
// returns its position.
func (s *Server) readPageToken(ctx context.Context, token, kind, query, callerID string) (int, error) {
	var c pageClaims
	if err := s.d.Keys.Verify(ctx, signing.TypePage, token, &c); err != nil {
		return 0, fmt.Errorf("%w is not a page token this service issued (%v); start the search again without it", errPageToken, err)
	}
	switch {
	case c.ExpiresAt == nil || !time.Now().Before(c.ExpiresAt.Time):
		return 0, fmt.Errorf("%w has expired (they last %s); start the search again without it", errPageToken, pageTokenTTL)
	case c.Client != callerID:
		return 0, fmt.Errorf("%w was issued to another client", errPageToken)
	case c.Kind != kind || c.Query != query:
		return 0, fmt.Errorf("%w belongs to another search: send the same request as for the previous page, changing only page", errPageToken)
	case c.Offset < 0:
		return 0, fmt.Errorf("%w is malformed", errPageToken)
	}
	return c.Offset, nil
}
