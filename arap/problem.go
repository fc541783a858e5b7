package arap

import (
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/dbdown"
	"github.com/omcp/arap/requests"
)

// problems maps each problem code to its HTTP status and title. ARAP's own
// codes come first, with the statuses the draft assigns.
var problems = map[string]struct {
	status int
	title  string
}{
	authzen.ProblemNotRequestable:       {http.StatusBadRequest, "Access is not requestable"},
	authzen.ProblemExpiredDenial:        {http.StatusGone, "The requestable denial has expired"},
	authzen.ProblemInvalidDenialBinding: {http.StatusBadRequest, "The request cannot be bound to the denial"},
	authzen.ProblemDuplicateRequest:     {http.StatusConflict, "Idempotency-Key reused with a different body"},
	authzen.ProblemUnknownTask:          {http.StatusNotFound, "Unknown task"},
	authzen.ProblemTaskExpired:          {http.StatusGone, "The task has expired"},
	authzen.ProblemInvalidTaskState:     {http.StatusConflict, "Not possible in the task's current state"},

	authzen.ProblemInvalidRequest:        {http.StatusBadRequest, "Malformed request"},
	authzen.ProblemInvalidIdempotencyKey: {http.StatusBadRequest, "Malformed Idempotency-Key"},
	authzen.ProblemSchemaViolation:       {http.StatusBadRequest, "The submission does not satisfy the request schema"},
	authzen.ProblemUnsupported:           {http.StatusBadRequest, "Not supported"},
	authzen.ProblemActorNotAuthorized:    {http.StatusForbidden, "Actor not authorized for this client"},
	authzen.ProblemUnauthorized:          {http.StatusUnauthorized, "Authentication required"},
	authzen.ProblemInsufficientScope:     {http.StatusForbidden, "Insufficient scope"},
	authzen.ProblemPayloadTooLarge:       {http.StatusRequestEntityTooLarge, "Request body too large"},
	authzen.ProblemUnsupportedMediaType:  {http.StatusUnsupportedMediaType, "Unsupported media type"},
	authzen.ProblemRateLimited:           {http.StatusTooManyRequests, "Too many requests"},
	authzen.ProblemMethodNotAllowed:      {http.StatusMethodNotAllowed, "Method not allowed"},
	authzen.ProblemNotFound:              {http.StatusNotFound, "Not found"},
	authzen.ProblemCallbackRefused:       {http.StatusBadRequest, "Callback endpoint refused"},
	authzen.ProblemIneligibleApprover:    {http.StatusForbidden, "Not eligible to decide this request"},
	authzen.ProblemAlreadyDecided:        {http.StatusConflict, "This approver has already decided"},
	authzen.ProblemApprovalAlreadyUsed:   {http.StatusConflict, "The approval has already been used"},
	authzen.ProblemPolicyInvalid:         {http.StatusUnprocessableEntity, "The policy has errors"},
	authzen.ProblemChannelNotAllowed:     {http.StatusForbidden, "The rule does not take decisions through this channel"},
	authzen.ProblemSignatureRequired:     {http.StatusForbidden, "The rule requires a decision signed with the approver's passkey"},
	authzen.ProblemUnknownPerson:         {http.StatusUnprocessableEntity, "on_behalf_of names no active directory user"},
	authzen.ProblemInternal:              {http.StatusInternalServerError, "Internal error"},
	authzen.ProblemUnavailable:           {http.StatusServiceUnavailable, "Service temporarily unavailable"},
}

// ProblemStatus returns the HTTP status of a problem code.
func ProblemStatus(code string) int {
	if p, ok := problems[code]; ok {
		return p.status
	}
	return http.StatusInternalServerError
}

func writeProblem(w http.ResponseWriter, r *http.Request, code, detail string, errs []string) {
	writeProblemWith(w, r, code, detail, errs, nil)
}

// writeProblemWith is writeProblem with extension members set by extend.
func writeProblemWith(w http.ResponseWriter, r *http.Request, code, detail string, errs []string, extend func(*authzen.Problem)) {
	p, ok := problems[code]
	if !ok {
		p = problems[authzen.ProblemInternal]
		code = authzen.ProblemInternal
	}
	if r != nil && isPlain(r) {
		// AuthZEN 1.0 evaluation endpoints answer errors with a plain message.
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(p.status)
		msg := detail
		if len(errs) > 0 {
			msg += "\n" + strings.Join(errs, "\n")
		}
		_, _ = w.Write([]byte(msg + "\n"))
		return
	}
	doc := authzen.Problem{Type: authzen.ProblemType(code), Title: p.title, Status: p.status, Detail: detail, Errors: errs}
	if r != nil {
		doc.Instance = r.URL.EscapedPath()
	}
	if extend != nil {
		extend(&doc)
	}
	w.Header().Set("Content-Type", authzen.ProblemContentType)
	w.WriteHeader(p.status)
	_ = json.NewEncoder(w).Encode(doc)
}

// fail writes err as a problem: a refusal from the domain packages with its
// own code, anything else as an internal error (logged, not shown).
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	var re *requests.Error
	if errors.As(err, &re) {
		if _, ok := problems[re.Code]; ok {
			writeProblemWith(w, r, re.Code, re.Detail, re.Errors, func(p *authzen.Problem) { p.UsedAt, p.EvaluationID = re.UsedAt, re.UsedBy })
			return
		}
	}
	s.internal(w, r, err)
}

// internal answers a failure that is not the caller's: 503 with Retry-After
// while the database is unavailable (the caller may retry; nothing
// changed), otherwise 500.
func (s *Server) internal(w http.ResponseWriter, r *http.Request, err error) {
	if dbdown.Is(err) {
		s.d.Log.WarnContext(r.Context(), "database unavailable", "route", r.URL.Path, "request_id", requestIDOf(r), "error", err)
		w.Header().Set("Retry-After", dbdown.RetryAfterHeader)
		writeProblem(w, r, authzen.ProblemUnavailable, UnavailableDetail, nil)
		return
	}
	s.d.Log.ErrorContext(r.Context(), "request failed", "route", r.URL.Path, "request_id", requestIDOf(r), "error", err)
	writeProblem(w, r, authzen.ProblemInternal, "internal error; the request id in X-Request-ID identifies it in the logs", nil)
}

// UnavailableDetail is the detail of the answer while the database is
// unavailable.
var UnavailableDetail = "the database is unavailable; retry after " + dbdown.RetryAfterHeader + " seconds"

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// errBody says why a body could not be read.
type errBody struct {
	code, detail string
}

// readBody reads a JSON request body of at most limit bytes. An empty body is
// allowed when optional.
func readBody(w http.ResponseWriter, r *http.Request, limit int64, optional bool) ([]byte, *errBody) {
	if r.ContentLength > limit {
		return nil, &errBody{authzen.ProblemPayloadTooLarge, tooLarge(limit)}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return nil, &errBody{authzen.ProblemPayloadTooLarge, tooLarge(limit)}
	}
	if err != nil {
		return nil, &errBody{authzen.ProblemInvalidRequest, "could not read the request body"}
	}
	if len(body) == 0 {
		if optional {
			return nil, nil
		}
		return nil, &errBody{authzen.ProblemInvalidRequest, "a JSON body is required"}
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return nil, &errBody{authzen.ProblemUnsupportedMediaType, "the body must be sent as Content-Type: application/json"}
	}
	return body, nil
}

func tooLarge(limit int64) string {
	return "the request body is larger than the limit of " + strconv.FormatInt(limit, 10) + " bytes"
}
