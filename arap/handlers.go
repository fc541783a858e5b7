package arap

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/internal/clean"
	"github.com/omcp/arap/internal/dbdown"
	"github.com/omcp/arap/requests"
)

var decisions = promauto.NewCounterVec(prometheus.CounterOpts{
	Name: "arap_decisions_total", Help: "Access evaluation decisions, by effect (allow, deny, request).",
}, []string{"effect"})

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz answers 200 when the process can take traffic, else 503 with a
// reason; with the database's durability (synchronous_commit, standbys, a
// warning when a failover could lose an execution claim) whenever the
// database answered. A warning is not an outage: ready stays 200.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	report, err := s.d.Ready(r.Context())
	body := map[string]any{"status": "ready"}
	if report != nil {
		body["database"] = report
	}
	if err != nil {
		s.d.Log.WarnContext(r.Context(), "not ready", "error", err)
		// The probe is unauthenticated: the reason names the part, never
		// the driver's text (host, port, user).
		reason := err.Error()
		switch {
		case dbdown.ReadOnly(err):
			reason = "the database is read-only (a standby in recovery, or transaction_read_only is on): writes are refused"
		case dbdown.Is(err):
			reason = "the database is unavailable"
		}
		body["status"], body["reason"] = "unavailable", reason
		writeJSON(w, http.StatusServiceUnavailable, body)
		return
	}
	writeJSON(w, http.StatusOK, body)
}

func (s *Server) url(path string) string { return s.d.PublicURL + path }

func (s *Server) discovery(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Cache-Control", "max-age=300")
	writeJSON(w, http.StatusOK, authzen.Metadata{
		PolicyDecisionPoint:       s.d.PublicURL,
		AccessEvaluationEndpoint:  s.url(authzen.PathEvaluation),
		AccessEvaluationsEndpoint: s.url(authzen.PathEvaluations),
		AccessRequestEndpoint:     s.url(authzen.PathRequests),
		SearchSubjectEndpoint:     s.url(authzen.PathSearchSubject),
		SearchResourceEndpoint:    s.url(authzen.PathSearchResource),
		SearchActionEndpoint:      s.url(authzen.PathSearchAction),
		JWKSURI:                   s.url(authzen.PathJWKS),
		Capabilities:              []string{authzen.CapabilityAccessRequest},
	})
}

func (s *Server) jwks(w http.ResponseWriter, r *http.Request) {
	set, err := s.d.Keys.JWKS(r.Context())
	if err != nil {
		s.internal(w, r, err)
		return
	}
	// Short caching: verifiers refetch on an unknown kid anyway.
	w.Header().Set("Cache-Control", "max-age=60")
	w.Header().Set("Content-Type", "application/jwk-set+json")
	_ = json.NewEncoder(w).Encode(set)
}

// decodeJSON decodes body into v, reporting type errors with the member
// name; a body with invalid UTF-8 or a NUL in a string is refused.
func decodeJSON(body []byte, v any) error {
	if err := clean.JSON(body); err != nil {
		return fmt.Errorf("the body is refused: %w", err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			if te.Field == "" {
				return errors.New("the body must be a JSON object, not " + jsonKind(te.Value))
			}
			return errors.New(te.Field + ": expected " + jsonTypeName(te.Type) + ", got " + jsonKind(te.Value))
		}
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return errors.New("the body is not valid JSON: " + se.Error())
		}
		return err
	}
	return nil
}

// jsonTypeName names the JSON type a Go type decodes from, for messages
// that speak the client's language rather than ours.
func jsonTypeName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Map, reflect.Struct:
		return "a JSON object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8,
		reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Pointer:
		return jsonTypeName(t.Elem())
	}
	return t.String()
}

// jsonKind names what encoding/json found ("string", "array", "number 5").
func jsonKind(v string) string {
	switch v {
	case "object":
		return "an object"
	case "array":
		return "an array"
	}
	return v
}

func (s *Server) evaluate(w http.ResponseWriter, r *http.Request) {
	body, berr := readBody(w, r, s.d.Limits.MaxBody, false)
	if berr != nil {
		writeProblem(w, r, berr.code, berr.detail, nil)
		return
	}
	var req authzen.EvaluationRequest
	if err := decodeJSON(body, &req); err != nil {
		writeProblem(w, r, authzen.ProblemInvalidRequest, err.Error(), nil)
		return
	}
	if v := evaluation.ValidateRequest(req); len(v) > 0 {
		writeProblem(w, r, authzen.ProblemInvalidRequest, "the evaluation request is malformed or names a non-canonical identity", v)
		return
	}
	out, err := s.d.Engine.Evaluate(r.Context(), clientFrom(r).ID, req)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	s.decided(out)
	writeJSON(w, http.StatusOK, s.wire(out.Decision))
}

func (s *Server) evaluateBatch(w http.ResponseWriter, r *http.Request) {
	body, berr := readBody(w, r, s.d.Limits.MaxBatchBody, false)
	if berr != nil {
		writeProblem(w, r, berr.code, berr.detail, nil)
		return
	}
	var req authzen.EvaluationsRequest
	if err := decodeJSON(body, &req); err != nil {
		writeProblem(w, r, authzen.ProblemInvalidRequest, err.Error(), nil)
		return
	}
	if len(req.Evaluations) > s.d.Limits.MaxBatchItems {
		writeProblem(w, r, authzen.ProblemPayloadTooLarge, "too many evaluations in one batch; the limit is "+strconv.Itoa(s.d.Limits.MaxBatchItems), nil)
		return
	}
	if v := evaluation.ValidateBatch(req); len(v) > 0 {
		writeProblem(w, r, authzen.ProblemInvalidRequest, "the evaluations request is malformed or names a non-canonical identity", v)
		return
	}
	outs, err := s.d.Engine.EvaluateBatch(r.Context(), clientFrom(r).ID, req)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	if len(req.Evaluations) == 0 {
		// Without an evaluations array the batch endpoint answers like the
		// single one.
		s.decided(outs[0])
		writeJSON(w, http.StatusOK, s.wire(outs[0].Decision))
		return
	}
	resp := authzen.EvaluationsResponse{Evaluations: make([]authzen.Decision, len(outs))}
	for i, o := range outs {
		s.decided(o)
		resp.Evaluations[i] = s.wire(o.BatchItem())
	}
	writeJSON(w, http.StatusOK, resp)
}

func (s *Server) decided(o evaluation.Outcome) { decisions.WithLabelValues(o.Effect).Inc() }

// wire fills in deployment URLs of a decision's access_request hint.
func (s *Server) wire(d authzen.Decision) authzen.Decision {
	if hint, ok := d.Context[authzen.CtxAccessRequest].(authzen.AccessRequestHint); ok {
		hint.Endpoint = s.url(authzen.PathRequests)
		d.Context[authzen.CtxAccessRequest] = hint
	}
	return d
}

func (s *Server) requestSchema(w http.ResponseWriter, r *http.Request) {
	rule, ok := s.d.Engine.Policy().RuleForTemplate(chi.URLParam(r, "template"))
	if !ok || rule.RequestSchema == nil {
		writeProblem(w, r, authzen.ProblemNotFound, "no request schema for this template", nil)
		return
	}
	doc := map[string]any{}
	for k, v := range rule.RequestSchema {
		doc[k] = v
	}
	doc["$schema"] = "https://json-schema.org/draft/2020-12/schema"
	doc["$id"] = s.url(authzen.PathSchemas + "/" + rule.Template)
	w.Header().Set("Content-Type", "application/schema+json")
	_ = json.NewEncoder(w).Encode(doc)
}

func caller(c *clients.Client) requests.Caller {
	return requests.Caller{ID: c.ID, Name: c.Name, MayAssertActor: c.MayAssertActor}
}

func (s *Server) submit(w http.ResponseWriter, r *http.Request) {
	body, berr := readBody(w, r, s.d.Limits.MaxBody, false)
	if berr != nil {
		writeProblem(w, r, berr.code, berr.detail, nil)
		return
	}
	res, err := s.d.Requests.Submit(r.Context(), caller(clientFrom(r)), r.Header.Get(authzen.HeaderIdempotencyKey), body)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	endpoint := s.d.Requests.StatusEndpoint(res.Request.ID)
	w.Header().Set("Location", endpoint)
	if res.Replayed {
		w.Header().Set(authzen.HeaderIdempotentReplayed, "true")
	}
	writeJSON(w, http.StatusAccepted, res.Request.Handle(endpoint))
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	req, err := s.d.Requests.Get(r.Context(), caller(clientFrom(r)), chi.URLParam(r, "id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Status == requests.Pending {
		// Pollers should back off; ARAP PEPs honour Retry-After.
		w.Header().Set("Retry-After", "5")
	}
	writeJSON(w, http.StatusOK, req.Handle(s.d.Requests.StatusEndpoint(req.ID)))
}

// cancelBody is the optional body of a cancellation (ARAP section 3.5).
type cancelBody struct {
	Reason  string `json:"reason"`
	Comment string `json:"comment"`
}

func (s *Server) cancel(w http.ResponseWriter, r *http.Request) {
	body, berr := readBody(w, r, s.d.Limits.MaxBody, true)
	if berr != nil {
		writeProblem(w, r, berr.code, berr.detail, nil)
		return
	}
	var cb cancelBody
	if body != nil {
		if err := decodeJSON(body, &cb); err != nil {
			writeProblem(w, r, authzen.ProblemInvalidRequest, err.Error(), nil)
			return
		}
		if len(cb.Reason) > 64 || len(cb.Comment) > 1000 || strings.ContainsFunc(cb.Reason, func(c rune) bool { return c <= ' ' || c > '~' }) {
			writeProblem(w, r, authzen.ProblemInvalidRequest, "reason must be a short code (at most 64 printable characters, no spaces) and comment at most 1000 characters", nil)
			return
		}
	}
	req, err := s.d.Requests.Cancel(r.Context(), caller(clientFrom(r)), chi.URLParam(r, "id"), cb.Reason, cb.Comment)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, req.Handle(s.d.Requests.StatusEndpoint(req.ID)))
}
