package pep

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/omcp/arap/agentauth"
	"github.com/omcp/arap/internal/clean"
	"github.com/omcp/arap/internal/clientip"
	"github.com/omcp/arap/internal/dbdown"
	"github.com/omcp/arap/internal/durability"
	"github.com/omcp/arap/internal/logs"
	"github.com/omcp/arap/internal/ratelimit"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/upstream"
	"github.com/omcp/arap/webhook"
)

// Paths served by the front-end.
const (
	PathMCP      = "/mcp"
	PathCallback = "/callbacks/arap"
)

// ServerOptions configure NewServer.
type ServerOptions struct {
	Name, Version string
	// WebhookSecrets verify the backend's callbacks; without any, the
	// callback endpoint is off and tasks are tracked by polling alone.
	WebhookSecrets []string
	// TrustedProxies are the peers whose X-Forwarded-For is believed
	// (internal/clientip); none: every request's address is its peer.
	TrustedProxies []netip.Prefix
	// MetricsElsewhere leaves GET /metrics out: they are served on a
	// listener of their own (--metrics-addr).
	MetricsElsewhere bool
	// RequestsPerMinute bounds each caller's MCP requests (default 1200),
	// counted in Counters for all replicas together.
	RequestsPerMinute int
	// Counters count the rate limits; default: pep.rate_counters in the
	// gate's database.
	Counters *ratelimit.Counters
	// Replay remembers the callbacks' webhook ids for every replica;
	// default: pep.webhook_ids in the gate's database.
	Replay webhook.ReplayStore
	// Extra registers additional tools or methods on the SDK server (the
	// conformance fixtures).
	Extra func(s *sdk.Server, ts *tasks.Server) error
	// Anonymous, when set, is the principal of a request that carries no
	// Authorization header at all (a wrong token is still refused). Only the
	// conformance fixture mode sets it: the official suite sends no token.
	Anonymous *Principal
	// Notifier serves subscriptions/listen for tasks (started and stopped
	// by the owner); nil refuses task listen streams.
	Notifier *tasks.Notifier
	// Ready reports the components that cannot serve now, by name (none:
	// ready), and the database's durability when it answered; GET /readyz
	// answers 503 naming them, and shows the durability either way. Nil:
	// always ready.
	Ready func(ctx context.Context) (map[string]error, *durability.Report)
	// Upstreams, when set, are the upstream MCP servers whose resources,
	// prompts and completions pass through (passthrough.go), each request
	// decided by the PDP; their tools come through the gate's sources.
	Upstreams *upstream.Registry
	// Agents, when set, also admits callers with OAuth access tokens of
	// the authorization servers it trusts (MCP authorization), beside the
	// caller tokens arap issues, and serves the protected resource
	// metadata.
	Agents *agentauth.Verifier
	Log    *slog.Logger
}

// Server is the MCP front-end's HTTP handler.
type Server struct {
	gate    *Gate
	tasks   *tasks.Server
	sdk     *sdk.Server
	handler http.Handler
	anon    *Principal
	agents  *agentauth.Verifier // nil: caller tokens only
	ready   func(context.Context) (map[string]error, *durability.Report)
	log     *slog.Logger

	toolsMu sync.Mutex
	shown   map[string]string // the gate's tools registered on sdk: name -> digest

	pass    *passthrough // nil without upstreams
	changes changes      // what listen streams hear of besides tasks
}

// NewServer builds the MCP server around g: the SDK server (stateless
// streamable HTTP, JSON responses) with the gate's tools, the tasks extension
// and the tool-approval extension advertised, bearer authentication, and the
// backend callback endpoint.
func NewServer(g *Gate, o ServerOptions) (*Server, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.RequestsPerMinute == 0 {
		o.RequestsPerMinute = 1200
	}
	if o.Counters == nil {
		o.Counters = ratelimit.NewCounters(g.cfg.DB, RateCounters)
	}
	if o.Replay == nil {
		o.Replay = &WebhookIDs{DB: g.cfg.DB}
	}
	perCaller, err := o.Counters.NewLimiter("caller", o.RequestsPerMinute, time.Minute)
	if err != nil {
		return nil, err
	}
	sdkLog := logs.Quiet(o.Log, slog.LevelWarn) // the SDK logs every stateless session at info
	srv := &Server{gate: g, anon: o.Anonymous, ready: o.Ready, log: o.Log, shown: map[string]string{}, agents: o.Agents}
	var complete func(context.Context, *sdk.CompleteRequest) (*sdk.CompleteResult, error)
	if o.Upstreams != nil {
		srv.pass = &passthrough{reg: o.Upstreams}
		complete = srv.complete // advertised only while an upstream offers completions (advertise)
	}
	s := sdk.NewServer(&sdk.Implementation{Name: o.Name, Version: o.Version}, &sdk.ServerOptions{
		Logger: sdkLog,
		Capabilities: &sdk.ServerCapabilities{
			Tools:      &sdk.ToolCapabilities{},
			Extensions: map[string]any{tasks.ExtensionID: map[string]any{}, ExtensionToolApproval: map[string]any{}},
		},
		CompletionHandler: complete,
	})
	if brokenBuild && broken(violateToolApprovalUndeclared) {
		s = sdk.NewServer(&sdk.Implementation{Name: o.Name, Version: o.Version}, &sdk.ServerOptions{Logger: sdkLog,
			Capabilities: &sdk.ServerCapabilities{Tools: &sdk.ToolCapabilities{}, Extensions: map[string]any{tasks.ExtensionID: map[string]any{}}}})
	}
	srv.changes.s = srv
	ts := &tasks.Server{Store: g.tasks, Kinds: map[string]tasks.Kind{KindApproval: g}, Notifier: o.Notifier, Changes: &srv.changes, Log: o.Log}
	if err := ts.Register(s); err != nil {
		return nil, err
	}
	if o.Extra != nil {
		if err := o.Extra(s, ts); err != nil {
			return nil, err
		}
	}
	srv.tasks, srv.sdk = ts, s
	if g.cfg.ApprovalTools {
		s.AddTool(approvalStatusTool(), g.approvalStatus)
	}
	if o.Upstreams != nil {
		// Registered before the first sync, so no change falls between.
		o.Upstreams.OnChange(srv.ToolsChanged)
		// An upstream's announcement reaches the listen streams even when
		// the gateway's own lists came out the same (a definition
		// re-registered as it was): its clients re-list, as the
		// upstream's would.
		o.Upstreams.OnAnnounce(func(kinds upstream.Announced) {
			for _, k := range []struct {
				bit    upstream.Announced
				method string
			}{
				{upstream.AnnouncedTools, tasks.NotificationToolsListChanged},
				{upstream.AnnouncedPrompts, tasks.NotificationPromptsListChanged},
				{upstream.AnnouncedResources, tasks.NotificationResourcesListChanged},
			} {
				if kinds&k.bit != 0 {
					srv.changes.listChanged(k.method)
				}
			}
		})
	}
	srv.syncTools()
	srv.syncOffers()
	s.AddReceivingMiddleware(srv.route)

	getServer := func(*http.Request) *sdk.Server { return s }
	mcpHandler := byNotifications(
		sdk.NewStreamableHTTPHandler(getServer, &sdk.StreamableHTTPOptions{Stateless: true, JSONResponse: true, Logger: sdkLog}),
		sdk.NewStreamableHTTPHandler(getServer, &sdk.StreamableHTTPOptions{Stateless: true, Logger: sdkLog}))
	limit := perCaller.Middleware(func(r *http.Request) string { return tasks.PrincipalFrom(r.Context()) }, tooMany,
		func(w http.ResponseWriter, r *http.Request, err error) {
			if dbdown.Is(err) {
				o.Log.WarnContext(r.Context(), "rate limit: database unavailable; refusing the request", "error", err)
				tasks.WriteUnavailable(w, r, tasks.WhatDatabase)
				return
			}
			o.Log.ErrorContext(r.Context(), "rate limit unavailable; refusing the request", "error", err)
			http.Error(w, "internal error", http.StatusInternalServerError)
		})
	mux := http.NewServeMux()
	mux.Handle(PathMCP, srv.authenticate(limit(ts.Wrap(mcpHandler))))
	if len(o.WebhookSecrets) > 0 {
		v, err := webhook.NewVerifier(o.WebhookSecrets...)
		if err != nil {
			return nil, err
		}
		v.Replay = o.Replay
		mux.Handle("POST "+PathCallback, v.Middleware(http.HandlerFunc(srv.callback)))
	}
	mux.HandleFunc("GET "+PathHealth, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
	})
	mux.HandleFunc("GET "+PathReady, srv.readyz)
	if o.Agents != nil {
		// RFC 9728: at the well-known path before the endpoint's path, and
		// at the bare one, which clients try next.
		mux.Handle("GET "+o.Agents.MetadataPath(), o.Agents.MetadataHandler())
		mux.Handle("GET /.well-known/oauth-protected-resource", o.Agents.MetadataHandler())
	}
	// Unauthenticated, like the backend's: counts by bounded labels only;
	// keep it off public networks (docs/reference.md, Operations).
	if !o.MetricsElsewhere {
		mux.Handle("GET "+PathMetrics, g.cfg.Metrics.Handler(o.Log))
	}
	srv.handler = clientip.Trust(o.TrustedProxies)(srv.accessLog(cleanURLs(mux)))
	return srv, nil
}

// cleanURLs refuses a path or query holding control characters or invalid
// UTF-8 (see internal/clean) before any handler sees it: 404 for such a
// path, 400 for such a query.
func cleanURLs(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := clean.Path(r.URL.Path); err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		if err := clean.Query(r.URL.RawQuery); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// byNotifications answers a request with a single JSON response (plain),
// unless notifications may travel with it and the client accepts an event
// stream, the only way they can (stream): it asks for progress
// (_meta.progressToken) or log messages (_meta logLevel, 2026-07-28), or it
// is a forwarded request of a revision before 2026-07-28, whose log level is
// the session's (logging/setLevel), not the request's.
func byNotifications(plain, stream http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || !strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
			plain.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, tasks.MaxBody))
		if err != nil {
			http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			Method string `json:"method"`
			Params struct {
				Meta struct {
					ProgressToken any `json:"progressToken"`
					LogLevel      any `json:"io.modelcontextprotocol/logLevel"`
				} `json:"_meta"`
			} `json:"params"`
		}
		if json.Unmarshal(body, &msg) == nil && (msg.Params.Meta.ProgressToken != nil || msg.Params.Meta.LogLevel != nil ||
			forwards(msg.Method) && r.Header.Get(tasks.HeaderProtocolVersion) < tasks.ProtocolVersion) {
			stream.ServeHTTP(w, r)
			return
		}
		plain.ServeHTTP(w, r)
	})
}

// forwards reports whether method is one an upstream answers on a caller's
// behalf, while it may log.
func forwards(method string) bool {
	switch method {
	case "tools/call", ActionGetPrompt, ActionReadResource, ActionComplete:
		return true
	}
	return false
}

type resultKey struct{}

// relay is the SDK-level handler of every tool. The gate has already decided
// (in route); relay hands its CallToolResult back through the SDK's own
// tools/call path, which sets resultType (complete, or input_required for an
// MRTR round) the way the protocol version wants.
func relay(ctx context.Context, _ *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
	res, ok := ctx.Value(resultKey{}).(*sdk.CallToolResult)
	if !ok {
		return nil, errors.New("tools/call must go through the approval gate")
	}
	return res, nil
}

// unserved are the methods of features this server does not offer unless
// an upstream does (passthrough.go: served). The SDK would answer them (an
// empty prompts/list, say), which would contradict the capabilities in
// server/discover; they are unknown methods here (-32601, HTTP 404).
var unserved = map[string]bool{
	"prompts/list": true, "prompts/get": true,
	"resources/list": true, "resources/read": true, "resources/templates/list": true,
	"resources/subscribe": true, "resources/unsubscribe": true,
	"completion/complete": true,
}

// route puts the caller's principal in the context of every method, refuses
// the methods of features not served, and sends tools/call through the gate.
func (s *Server) route(next sdk.MethodHandler) sdk.MethodHandler {
	return func(ctx context.Context, method string, req sdk.Request) (sdk.Result, error) {
		if unserved[method] && !s.served(method) {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "method not found: " + method}
		}
		p := principalOf(req.GetExtra())
		ctx = tasks.WithPrincipal(ctx, p.Key())
		if brokenBuild && broken(violateOtherPrincipalsTask) { // serves any task to anyone, as its owner
			id := ""
			switch x := req.GetParams().(type) {
			case *tasks.TaskParams:
				id = x.TaskID
			case *tasks.UpdateParams:
				id = x.TaskID
			}
			if t, err := s.gate.tasks.Get(ctx, s.gate.cfg.DB, id); err == nil {
				ctx = tasks.WithPrincipal(ctx, t.Principal)
			}
		}
		if method == "tools/list" {
			s.syncTools()
		}
		if method == "tools/call" {
			ctr, ok := req.(*sdk.CallToolRequest)
			if !ok || p.SubjectID == "" {
				return nil, &jsonrpc.Error{Code: tasks.CodeInvalidParams, Message: "unauthenticated"}
			}
			if t, err := s.gate.catalog.lookup(ctr.Params.Name); !errors.Is(err, errNoTool) {
				if t != nil {
					s.syncTool(t)
				}
				if p.anonymous {
					return nil, &jsonrpc.Error{Code: tasks.CodeInvalidParams,
						Message: "unauthenticated: without a bearer token only the conformance fixtures can be called"}
				}
				res, err := s.gate.Call(ctx, p, ctr)
				noteMethod(ctx, method, ctr.Params.Name, s.gate.cfg.Metrics.called(ctr.Params.Name, res, err))
				if cr, ok := res.(*sdk.CallToolResult); ok && err == nil {
					return next(context.WithValue(ctx, resultKey{}, cr), method, req)
				}
				return res, s.retryable(method, err)
			}
		}
		noteMethod(ctx, method, "", "")
		switch method {
		case "initialize", "server/discover":
			res, err := next(ctx, method, req)
			if err == nil {
				s.advertise(res)
				if ir, ok := res.(*sdk.InitializeResult); ok && ir.ProtocolVersion == tasks.LegacyVersion {
					return legacyInitialize{ir}, nil
				}
			}
			return res, err
		case "resources/list", "resources/templates/list", "resources/read", "prompts/list", "prompts/get":
			s.syncOffers()
		}
		res, err := next(ctx, method, req)
		if lt, ok := res.(*sdk.ListToolsResult); ok && err == nil && tasks.IsLegacy(ctx) {
			return legacyTools{lt}, nil
		}
		return res, s.retryable(method, err)
	}
}

// retryable is what the caller is answered for err: an error with a
// JSON-RPC code as it is; any other (which the SDK would answer with code
// 0 and the error's text, naming tables or addresses) as tasks.InternalError
// answers it: retryable while the database is unavailable, otherwise an
// internal error, its cause logged.
func (s *Server) retryable(method string, err error) error {
	var je *jsonrpc.Error
	if err == nil || errors.As(err, &je) {
		return err
	}
	return tasks.InternalError(s.log, method, err)
}

// callback receives the backend's signed callbacks (verified by the
// middleware) and hands them to the gate (Wake), which only wakes the task.
func (s *Server) callback(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	body, err := webhook.ParseBody(raw)
	if err != nil {
		http.Error(w, "malformed callback: "+err.Error(), http.StatusBadRequest)
		return
	}
	if err := s.gate.Wake(r.Context(), body.State, body.Task.ID); err != nil {
		s.log.ErrorContext(r.Context(), "callback: task lookup failed", "error", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
