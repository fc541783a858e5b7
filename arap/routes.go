package arap

import (
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/internal/clientip"
	"github.com/omcp/arap/openapi"
)

// routes lists the whole HTTP surface.
func (s *Server) routes() http.Handler {
	r := chi.NewRouter()
	r.Use(clientip.Trust(s.d.TrustedProxies), recoverer(s.d.Log), requestID, s.accessLog, securityHeaders, cleanURLs)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, authzen.ProblemNotFound, "no such endpoint: "+r.Method+" "+r.URL.Path, nil)
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, authzen.ProblemMethodNotAllowed, r.Method+" is not allowed on "+r.URL.Path, nil)
	})

	// Operations.
	r.Get("/healthz", s.healthz)
	r.Get("/readyz", s.readyz)
	if s.d.Metrics != nil {
		r.Method(http.MethodGet, "/metrics", s.d.Metrics)
	}
	r.Get(openapi.Path, openapi.Handler)

	// The approvers' web interface (its own sessions, CSRF and headers).
	if s.d.UI != nil {
		r.Handle("/ui", s.d.UI)
		r.Handle("/ui/*", s.d.UI)
	}

	// Dev mode only: the notifications the dev mail sink received.
	if s.d.DevMail != nil {
		r.Method(http.MethodGet, "/dev/mail", s.d.DevMail)
		r.Method(http.MethodGet, "/dev/mail.json", s.d.DevMail)
	}

	// The Slack app's buttons: authenticated by Slack's request signature
	// (404 while Slack is not configured).
	r.Post("/slack/interactivity", s.slackInteractivity)

	// Public metadata.
	r.Get(authzen.WellKnownPath, s.discovery)
	r.Get(authzen.PathJWKS, s.jwks)

	// AuthZEN evaluation and search (errors in AuthZEN's plain form).
	r.Group(func(r chi.Router) {
		r.Use(plainErrors, s.authenticate, s.rateLimit, s.require(clients.ScopeEvaluate))
		r.Post(authzen.PathEvaluation, s.evaluate)
		r.Post(authzen.PathEvaluations, s.evaluateBatch)
		r.Post(authzen.PathSearchSubject, s.searchSubject)
		r.Post(authzen.PathSearchResource, s.searchResource)
		r.Post(authzen.PathSearchAction, s.searchAction)
	})

	// What may change a decision the PDP marked cacheable, for the
	// front-ends' decision caches: a long-lived event stream.
	r.With(s.authenticate, s.rateLimit, s.require(clients.ScopeEvaluate)).Get(authzen.PathDecisionChanges, s.decisionChanges)

	// ARAP (errors as problem+json).
	r.Group(func(r chi.Router) {
		r.Use(s.authenticate, s.rateLimit)
		r.With(s.require(clients.ScopeEvaluate, clients.ScopeRequest)).Get(authzen.PathSchemas+"/{template}", s.requestSchema)
		r.With(s.require(clients.ScopeRequest)).Route(authzen.PathRequests, func(r chi.Router) {
			r.Post("/", s.submit)
			r.Get("/{id}", s.status)
			r.Post("/{id}/cancel", s.cancel)
			r.Delete("/{id}/cancel", s.cancel)
			r.Delete("/{id}", s.cancel)
		})
	})

	// Decision API for resolvers (ITSM systems, supervising agents, risk
	// engines) and admins: problem+json errors, like ARAP.
	r.Group(func(r chi.Router) {
		r.Use(s.authenticate, s.rateLimit, s.require(clients.ScopeDecide, clients.ScopeAdmin))
		r.Get("/v1/requests", s.listRequests)
		r.Get("/v1/requests/{id}", s.showRequest)
		r.Post("/v1/requests/{id}/decisions", s.decide)
		r.Post("/v1/approvals/{id}/revoke", s.revokeApproval)
	})

	// Administration: the policy reloaded without a signal.
	r.With(s.authenticate, s.rateLimit, s.require(clients.ScopeAdmin)).Post("/v1/admin/policy/reload", s.reloadPolicy)

	// The audit trail, for SIEMs: problem+json errors.
	r.With(s.authenticate, s.rateLimit, s.require(clients.ScopeAudit)).Get("/v1/audit", s.auditStream)

	// Callback deliveries: for the client that registered them, and admins.
	r.Group(func(r chi.Router) {
		r.Use(s.authenticate, s.rateLimit, s.require(clients.ScopeRequest, clients.ScopeAdmin))
		r.Get("/v1/requests/{id}/deliveries", s.deliveries)
		r.Post("/v1/requests/{id}/deliveries/{delivery}/redeliver", s.redeliver)
	})
	return r
}
