package arap

import (
	"github.com/omcp/arap/internal/telemetry"

	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/internal/clean"
	"github.com/omcp/arap/internal/clientip"
	"github.com/omcp/arap/internal/logs"
)

var (
	httpRequests = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "arap_http_requests_total", Help: "HTTP requests served by the backend, by route and status code.",
	}, []string{"method", "route", "code"})
	httpDuration = promauto.NewHistogramVec(prometheus.HistogramOpts{
		Name: "arap_http_request_duration_seconds", Help: "Backend HTTP request latency by route.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	}, []string{"method", "route"})
)

type ctxKey int

const stateKey ctxKey = iota

// reqState is what the middleware learns of a request, put in its context
// once by requestID and filled in by the middleware inside it: each context
// value of its own made a copy of the request, and those copies were the
// largest part of the bytes an evaluation allocated.
type reqState struct {
	id     string          // the X-Request-ID, for logs
	client *clients.Client // authenticated (authenticate)
	plain  bool            // an AuthZEN evaluation route (plainErrors)
}

// state returns r's state, or nil outside requestID.
func state(r *http.Request) *reqState {
	st, _ := r.Context().Value(stateKey).(*reqState)
	return st
}

// withState returns r with a state: r itself inside requestID.
func withState(r *http.Request) (*http.Request, *reqState) {
	if st := state(r); st != nil {
		return r, st
	}
	st := &reqState{}
	return r.WithContext(context.WithValue(r.Context(), stateKey, st)), st
}

// plainErrors marks AuthZEN evaluation routes, whose errors are plain text
// (AuthZEN 1.0) rather than problem+json (ARAP).
func plainErrors(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r, st := withState(r)
		st.plain = true
		next.ServeHTTP(w, r)
	})
}

// clientFrom returns the authenticated client.
func clientFrom(r *http.Request) *clients.Client {
	if st := state(r); st != nil {
		return st.client
	}
	return nil
}

// requestID echoes X-Request-ID (AuthZEN 1.0) or assigns one, for logs.
func requestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := logs.RequestID(r.Header.Get(authzen.HeaderRequestID))
		w.Header().Set(authzen.HeaderRequestID, id)
		r, st := withState(r)
		st.id = id
		next.ServeHTTP(w, r)
	})
}

// accessLog logs one line per request and records metrics. Bodies, query
// strings and headers are never logged: they carry tokens and tool arguments.
func (s *Server) accessLog(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &logs.StatusRecorder{ResponseWriter: w}
		r, st := withState(r)
		next.ServeHTTP(rec, r)
		route := routeOf(chi.RouteContext(r.Context()))
		if route == "" {
			route = "unmatched"
		}
		elapsed := time.Since(start)
		telemetry.Route(r.Context(), r.Method, route)
		httpRequests.WithLabelValues(r.Method, route, strconv.Itoa(rec.Status)).Inc()
		httpDuration.WithLabelValues(r.Method, route).Observe(elapsed.Seconds())
		level := slog.LevelInfo
		if route == "/healthz" || route == "/readyz" || route == "/metrics" {
			level = slog.LevelDebug
		}
		if !s.d.Log.Enabled(r.Context(), level) {
			return // the line's attributes cost an evaluation a few percent
		}
		attrs := []any{"method", r.Method, "route", route, "status", rec.Status, "bytes", rec.Bytes,
			"duration_ms", float64(elapsed.Microseconds()) / 1000, "request_id", st.id, "remote", clientip.Addr(r).String()}
		if st.client != nil {
			attrs = append(attrs, "client", st.client.Name)
		}
		s.d.Log.Log(r.Context(), level, "http request", attrs...)
	})
}

// cleanURLs refuses a path or query holding control characters or invalid
// UTF-8 (see internal/clean) before any route sees it: 404 for such a path
// (nothing lives there), 400 for such a query; problem+json, or plain text
// for the web UI's pages.
func cleanURLs(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code, err := authzen.ProblemNotFound, clean.Path(r.URL.Path)
		if err == nil {
			code, err = authzen.ProblemInvalidRequest, clean.Query(r.URL.RawQuery)
		}
		if err == nil {
			next.ServeHTTP(w, r)
			return
		}
		if strings.HasPrefix(r.URL.Path, "/ui") {
			http.Error(w, err.Error(), ProblemStatus(code))
			return
		}
		writeProblem(w, r, code, err.Error(), nil)
	})
}

func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

func recoverer(log *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer func() {
				if v := recover(); v != nil {
					if v == http.ErrAbortHandler {
						panic(v)
					}
					log.Error("panic serving request", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
					writeProblem(w, r, authzen.ProblemInternal, "internal error", nil)
				}
			}()
			next.ServeHTTP(w, r)
		})
	}
}

// authenticate requires a valid bearer token (RFC 6750). Refusals are
// limited per address, so guessing tokens is slow.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := bearer(r)
		var c *clients.Client
		var err error
		if ok {
			c, err = s.d.Clients.Authenticate(r.Context(), token)
		}
		if !ok || errors.Is(err, clients.ErrUnauthenticated) {
			if !s.perIP.Serve(w, r, clientip.Key(r), tooMany, s.internal) {
				return
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="arap"`)
			if ok {
				w.Header().Set("WWW-Authenticate", `Bearer realm="arap", error="invalid_token"`)
			}
			detail := "an Authorization: Bearer <token> header is required"
			if ok {
				detail = "the bearer token is unknown or revoked"
			}
			writeProblem(w, r, authzen.ProblemUnauthorized, detail, nil)
			return
		}
		if err != nil {
			s.internal(w, r, err)
			return
		}
		r, st := withState(r)
		st.client = c
		next.ServeHTTP(w, r)
	})
}

func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// rateLimit applies each client's request budget, shared by all replicas
// (one statement per request; see internal/ratelimit). A request that
// cannot be counted is refused as an internal error: the limit fails closed.
func (s *Server) rateLimit(next http.Handler) http.Handler {
	return s.perClient.Middleware(func(r *http.Request) string { return clientFrom(r).ID }, tooMany, s.internal)(next)
}

// tooMany answers a refused request; the limiter has set Retry-After.
func tooMany(w http.ResponseWriter, r *http.Request) {
	writeProblem(w, r, authzen.ProblemRateLimited, "too many requests; retry after the number of seconds in Retry-After", nil)
}

// require admits clients holding any of scopes.
func (s *Server) require(scopes ...string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c := clientFrom(r)
			for _, sc := range scopes {
				if c.Has(sc) {
					next.ServeHTTP(w, r)
					return
				}
			}
			w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="arap", error="insufficient_scope", scope=%q`, strings.Join(scopes, " ")))
			writeProblem(w, r, authzen.ProblemInsufficientScope,
				fmt.Sprintf("client %q lacks the %s scope this endpoint needs", c.Name, strings.Join(scopes, " or ")), nil)
		})
	}
}

// routeOf is the pattern of the route that served a request, for logs,
// metrics and spans. A handler mounted on a wildcard that routes the whole
// path again itself (the web UI: "/ui/*", then "/ui/requests/{id}") names
// the route once, not chi's concatenation ("/ui/ui/requests/{id}").
func routeOf(rctx *chi.Context) string {
	ps := rctx.RoutePatterns
	if n := len(ps); n >= 2 && strings.HasSuffix(ps[n-2], "/*") && strings.HasPrefix(ps[n-1], strings.TrimSuffix(ps[n-2], "*")) {
		return ps[n-1]
	}
	return rctx.RoutePattern()
}

// isPlain says r is on an AuthZEN evaluation route (plainErrors).
func isPlain(r *http.Request) bool {
	st := state(r)
	return st != nil && st.plain
}

// requestIDOf is r's X-Request-ID, "" outside requestID.
func requestIDOf(r *http.Request) string {
	if st := state(r); st != nil {
		return st.id
	}
	return ""
}
