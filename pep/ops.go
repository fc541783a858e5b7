package pep

import (
	"github.com/omcp/arap/internal/telemetry"

	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/clientip"
	"github.com/omcp/arap/internal/dbdown"
	"github.com/omcp/arap/internal/durability"
	"github.com/omcp/arap/internal/logs"
)

// Operating the front-end: readiness, and one access-log line per request.
// Neither ever records a request body, a query string, a header's value
// (tokens) or a tool's arguments.

// Paths of the operations endpoints.
const (
	PathHealth  = "/healthz"
	PathReady   = "/readyz"
	PathMetrics = "/metrics"
)

// readyz answers 200 when every component is ready, else 503 naming the
// failing ones (their errors, which may hold addresses, are only logged;
// a read-only database is said so). The database's durability is shown
// either way: its warning is not an outage.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	var failing map[string]error
	var database *durability.Report
	if s.ready != nil {
		failing, database = s.ready(r.Context())
	}
	names := slices.Sorted(maps.Keys(failing))
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	body := map[string]any{"status": "ready"}
	if database != nil {
		body["database"] = database
	}
	if len(names) == 0 {
		_ = json.NewEncoder(w).Encode(body)
		return
	}
	attrs := make([]any, 0, 2*len(names))
	reasons := map[string]string{}
	for _, n := range names {
		attrs = append(attrs, n, failing[n].Error())
		if dbdown.ReadOnly(failing[n]) {
			reasons[n] = "the database is read-only (a standby in recovery, or transaction_read_only is on): writes are refused"
		}
	}
	s.log.WarnContext(r.Context(), "not ready", slog.Group("failing", attrs...))
	body["status"], body["failing"] = "unavailable", names
	if len(reasons) > 0 {
		body["reasons"] = reasons
	}
	w.WriteHeader(http.StatusServiceUnavailable)
	_ = json.NewEncoder(w).Encode(body)
}

// logInfo carries what inner handlers learn back to the access log.
type logInfo struct {
	mu                                      sync.Mutex
	caller, method, tool, outcome, decision string
}

type logInfoKey struct{}

// noteCaller records, for the access log, the caller's name.
func noteCaller(ctx context.Context, name string) {
	if li, ok := ctx.Value(logInfoKey{}).(*logInfo); ok {
		li.mu.Lock()
		li.caller = name
		li.mu.Unlock()
	}
}

// Where a request's allow came from (logInfo.decision): the gate's
// decision cache, or the PDP asked now.
const (
	decisionFromCache = "cache"
	decisionFromPDP   = "pdp"
)

// noteDecision records, for the access log, where the request's decision
// came from.
func noteDecision(ctx context.Context, from string) {
	if li, ok := ctx.Value(logInfoKey{}).(*logInfo); ok {
		li.mu.Lock()
		li.decision = from
		li.mu.Unlock()
	}
}

// noteMethod records the JSON-RPC method (one the SDK knows), and for
// tools/call the tool (a configured one) and the outcome.
func noteMethod(ctx context.Context, method, tool, outcome string) {
	if li, ok := ctx.Value(logInfoKey{}).(*logInfo); ok {
		li.mu.Lock()
		li.method, li.tool, li.outcome = method, tool, outcome
		li.mu.Unlock()
	}
}

// accessLog logs one line per request and counts it: method, route (the
// pattern served, never the raw path or query), status, bytes, duration,
// request id, and what inner handlers noted (caller name, JSON-RPC method,
// tool, outcome). The probes log at debug.
func (s *Server) accessLog(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id := logs.RequestID(r.Header.Get(authzen.HeaderRequestID))
		w.Header().Set(authzen.HeaderRequestID, id)
		rec := &logs.StatusRecorder{ResponseWriter: w}
		li := &logInfo{}
		r = r.WithContext(context.WithValue(r.Context(), logInfoKey{}, li))
		next.ServeHTTP(rec, r)
		if rec.Status == 0 {
			rec.Status = http.StatusOK
		}
		// The mux sets the pattern on r (cleanURLs passes r on as is);
		// without its method, as the backend labels routes.
		route := r.Pattern
		if _, path, ok := strings.Cut(route, " "); ok {
			route = path
		}
		if route == "" {
			route = "unmatched"
		}
		elapsed := time.Since(start)
		telemetry.Route(r.Context(), r.Method, route)
		s.gate.cfg.Metrics.served(r.Method, route, rec.Status)
		li.mu.Lock()
		attrs := []any{"method", r.Method, "route", route, "status", rec.Status, "bytes", rec.Bytes,
			"duration_ms", float64(elapsed.Microseconds()) / 1000, "request_id", id, "remote", clientip.Addr(r).String()}
		for _, a := range [][2]string{{"caller", li.caller}, {"rpc_method", li.method}, {"tool", li.tool}, {"outcome", li.outcome}, {"decision", li.decision}} {
			if a[1] != "" {
				attrs = append(attrs, a[0], a[1])
			}
		}
		li.mu.Unlock()
		level := slog.LevelInfo
		if r.URL.Path == PathHealth || r.URL.Path == PathReady || r.URL.Path == PathMetrics {
			level = slog.LevelDebug
		}
		s.log.Log(r.Context(), level, "http request", attrs...)
	})
}

// BackendReady asks the backend whether it can serve (GET /readyz, which it
// serves without authentication), within two seconds.
func (g *Gate) BackendReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(g.cfg.Backend.BaseURL, "/")+PathReady, nil)
	if err != nil {
		return err
	}
	c := g.cfg.Backend.HTTP
	if c == nil {
		c = http.DefaultClient // bounded by ctx
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("backend readiness: HTTP %d", resp.StatusCode)
	}
	return nil
}
