package pep

import (
	"github.com/omcp/arap/internal/telemetry"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/clean"
	"github.com/omcp/arap/internal/dbdown"
	"github.com/omcp/arap/internal/schemamsg"
	"github.com/omcp/arap/internal/seal"
	"github.com/omcp/arap/mcp/tasks"
)

// Config configures a Gate.
type Config struct {
	DB      *pgxpool.Pool
	Backend *arapclient.Client
	// MasterKey (32 bytes) seals tool arguments and submission bodies.
	MasterKey []byte
	// PreviousMasterKeys (32 bytes each) open values sealed before a master-key
	// rotation; they never seal.
	PreviousMasterKeys [][]byte
	// CallbackURL is where the backend is asked to call back (this server's
	// callback endpoint); empty means poll only.
	CallbackURL string
	// Tools are built-in tools that never change (the demo tools); they
	// come before Sources, whose tools are read on every call. An exposed
	// name offered twice at startup is refused; one that appears twice
	// later is the first source's.
	Tools   []Tool
	Sources []ToolSource
	// PollInterval is suggested to clients (pollIntervalMs); default 2s.
	PollInterval time.Duration
	// ResultRetention keeps a terminal task readable this long; default 24h.
	ResultRetention time.Duration
	// ExecTimeout bounds a tool run and the writing of its outcome (the
	// run gets all but a fifth, at most 5s, of it); a claimed task whose
	// run has not been recorded by then ends outcome-unknown. Default 30s.
	ExecTimeout time.Duration
	// MaxChained bounds the requests opened for one task; default 3.
	MaxChained int
	// MaxWindow bounds how long a task may wait for a decision, whatever
	// deadline the backend sets (SEP-2848: pending tasks must not
	// accumulate without limit); past it the task ends denied and the
	// request is cancelled. Default 7 days.
	MaxWindow time.Duration
	// MaxPending bounds a principal's live approval tasks; default 20.
	MaxPending int
	// SubmitsPerMinute bounds a principal's new approval requests; default 30.
	SubmitsPerMinute int
	// ApprovalTools offers approval as ordinary tools to clients that do
	// not drive tasks (interim.go): their requestable calls open a
	// deferred task, followed with the approval_status tool and run when
	// the call is repeated after approval.
	ApprovalTools bool
	// StateTTL bounds an MRTR requestState's life; default 10 minutes.
	StateTTL time.Duration
	// IntentGrace is how long an intent may stay unbound before Reconcile
	// takes it over (the process that wrote it has probably died); default
	// 15s.
	IntentGrace time.Duration
	// ReconcileEvery is how often Start's reconciler repairs crash
	// leftovers (Reconcile); default 10s.
	ReconcileEvery time.Duration
	// DecisionCache bounds the allowed decisions remembered for reuse
	// (decisions.go), default DefaultDecisionCache; negative: none are,
	// every call asks the PDP. It is used only while Start's watcher hears
	// the backend's change stream.
	DecisionCache int
	// DecisionMaxAge bounds how long one is remembered, below the PDP's
	// own bound; default DefaultDecisionMaxAge.
	DecisionMaxAge time.Duration
	// Metrics counts calls, task endings and the task gauge (on the
	// metrics' registry); default: fresh metrics of the gate's own.
	Metrics *Metrics
	// TracerProvider traces tools/call and the work on approval tasks;
	// the global provider when nil.
	TracerProvider trace.TracerProvider
	Now            func() time.Time
	Log            *slog.Logger
}

// Gate is the enforcement point: it decides every tools/call through the PDP
// and runs approval tasks.
type Gate struct {
	cfg       Config
	box       *seal.Box
	tasks     *tasks.Store
	callers   *Callers
	decisions *decisions // nil: off
	catalog   *catalog
	advance   chan struct{} // bounds concurrent Advance runs started by callbacks
	bg        background    // what the gate runs on its own: wake-ups, the reconciler
	tracer    trace.Tracer
}

// NewGate checks cfg and builds a Gate.
func NewGate(cfg Config) (*Gate, error) {
	if cfg.DB == nil || cfg.Backend == nil {
		return nil, errors.New("pep: DB and Backend are required")
	}
	box, err := seal.New(cfg.MasterKey, cfg.PreviousMasterKeys...)
	if err != nil {
		return nil, fmt.Errorf("pep: %w", err)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.PollInterval, 2*time.Second)
	def(&cfg.ResultRetention, 24*time.Hour)
	def(&cfg.ExecTimeout, 30*time.Second)
	def(&cfg.StateTTL, 10*time.Minute)
	def(&cfg.MaxWindow, 7*24*time.Hour)
	def(&cfg.IntentGrace, 15*time.Second)
	def(&cfg.ReconcileEvery, 10*time.Second)
	def(&cfg.DecisionMaxAge, DefaultDecisionMaxAge)
	if brokenBuild && broken(violateNoRetention) { // keeps a result a minute
		cfg.ResultRetention = time.Minute
	}
	if cfg.MaxChained == 0 {
		cfg.MaxChained = 3
	}
	if cfg.MaxPending == 0 {
		cfg.MaxPending = 20
	}
	if cfg.SubmitsPerMinute == 0 {
		cfg.SubmitsPerMinute = 30
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	g := &Gate{cfg: cfg, box: box, tasks: &tasks.Store{DB: cfg.DB, Now: cfg.Now}, callers: &Callers{DB: cfg.DB, cache: newCallerCache(cfg.Now)}, advance: make(chan struct{}, 16),
		tracer: telemetry.Provider(cfg.TracerProvider).Tracer("github.com/omcp/arap/pep")}
	g.bg.life, g.bg.end = context.WithCancel(context.Background())
	if cfg.DecisionCache >= 0 && cfg.DecisionMaxAge > 0 {
		// Real time, not cfg.Now: how long a decision may be reused.
		g.decisions = &decisions{mem: newMemory[struct{}](time.Now, cmp.Or(cfg.DecisionCache, DefaultDecisionCache)), maxAge: cfg.DecisionMaxAge}
		g.callers.revoked = func() { g.forgetDecisions(causeCaller) }
	}
	sources := cfg.Sources
	if len(cfg.Tools) > 0 {
		// Their derived fields once, not on every call.
		static := make(StaticTools, len(cfg.Tools))
		for i, t := range cfg.Tools {
			if t.UpstreamTool == "" {
				t.UpstreamTool = t.Name
			}
			if t.Digest == "" {
				if t.Digest, err = ToolDigest(t); err != nil {
					return nil, err
				}
			}
			static[i] = t
		}
		sources = append([]ToolSource{static}, sources...)
	}
	var reserved []string
	if cfg.ApprovalTools {
		reserved = append(reserved, ToolApprovalStatus)
	}
	if g.catalog, err = newCatalog(sources, reserved...); err != nil {
		return nil, err
	}
	if g.cfg.Metrics == nil {
		g.cfg.Metrics = NewMetrics()
	}
	if err := g.cfg.Metrics.Register(newTaskCounts(g.tasks)); err != nil {
		return nil, fmt.Errorf("pep: metrics: %w", err)
	}
	return g, nil
}

func toJSONValue(v any) any {
	b, _ := json.Marshal(v)
	var out any
	_ = json.Unmarshal(b, &out)
	return out
}

func (g *Gate) now() time.Time { return g.cfg.Now().UTC().Truncate(time.Microsecond) }

// Tasks is the gate's task store.
func (g *Gate) Tasks() *tasks.Store { return g.tasks }

// Metrics are the gate's metrics (Config.Metrics).
func (g *Gate) Metrics() *Metrics { return g.cfg.Metrics }

// Callers is the gate's caller store.
func (g *Gate) Callers() *Callers { return g.callers }

// Call handles tools/call for principal p. It returns a CallToolResult, a
// CreateTaskResult, an input_required result, or a JSON-RPC error.
func (g *Gate) Call(ctx context.Context, p Principal, req *sdk.CallToolRequest) (sdk.Result, error) {
	// The span whose context an approval task stores (trace_parent): the
	// work done for the task later links to it. Never the arguments.
	ctx, span := g.tracer.Start(ctx, "tools/call", trace.WithAttributes(attribute.String("mcp.tool", req.Params.Name)))
	defer span.End()
	tool, err := g.catalog.lookup(req.Params.Name)
	if errors.Is(err, errNoTool) {
		return nil, rpcError(tasks.CodeInvalidParams, fmt.Sprintf("unknown tool %q", req.Params.Name))
	}
	if err != nil {
		g.cfg.Log.WarnContext(ctx, "tool not offered: its definition is unusable", "tool", req.Params.Name, "error", err.Error())
		return nil, rpcError(tasks.CodeInvalidParams, fmt.Sprintf("tool %q is unavailable: its definition is unusable", req.Params.Name))
	}
	args, err := g.arguments(req, tool)
	if err != nil {
		return nil, err
	}
	// The extension is declared per request from revision 2026-07-28 on;
	// a request of an older revision cannot use it, whatever its _meta says.
	version := protocolOf(req)
	hasTasks := tasks.HasExtension(req.Params.GetMeta()) && (version == "" || tasksCapable(version))
	// A 2025-11-25 client that asked for a task (params.task) drives that
	// revision's tasks (mcp/tasks legacy.go): the same task, other shapes.
	legacyTask := tasks.LegacyTaskRequested(ctx)
	hasTasks = hasTasks || legacyTask
	if brokenBuild && broken(violatePlainClientsGetTasks) {
		hasTasks = true
	}
	if brokenBuild && broken(violateNeedsToolApproval) {
		caps, _ := req.Params.GetMeta()[tasks.MetaClientCapabilities].(map[string]any)
		ext, _ := caps["extensions"].(map[string]any)
		_, hasTasks = ext[ExtensionToolApproval]
	}

	var answers *inputAnswers
	if req.Params.RequestState != "" {
		// An MRTR retry: it must match the binding the first call captured.
		if answers, err = g.resume(ctx, p, tool, args, req); err != nil {
			return nil, err
		}
	}

	decision, err := g.evaluate(ctx, evaluation(p, &tool.Tool, args))
	if err != nil {
		return nil, err
	}
	if decision.Decision {
		return g.runDirect(ctx, p, tool, args, req, answers)
	}
	if answers != nil && answers.relayed != nil {
		// An upstream's question belongs to a call that runs directly; one
		// the policy no longer allows so gets no answers forwarded.
		return denied("This call is no longer allowed by policy as it was when the upstream asked for input; the answers were not forwarded and the tool did not finish. Call the tool again.", RemediationUnavailable), nil
	}
	hint, requestable := decision.AccessRequest()
	if !requestable {
		if brokenBuild && broken(violatePlainDenialAsError) {
			return nil, rpcError(tasks.CodeInvalidParams, "not allowed")
		}
		return denied("This call is not allowed by policy; the tool did not run.", RemediationUnavailable), nil
	}
	if !hasTasks {
		if tool.TaskRequired {
			return nil, tasks.MissingCapability()
		}
		if !g.cfg.ApprovalTools {
			return degraded(hint, version), nil
		}
		return g.interim(ctx, p, tool, args, decision, hint, answers, version)
	}
	if brokenBuild && broken(violateExecuteOnRequestableDenial) {
		_, _ = g.runDirect(ctx, p, tool, args, req, nil)
	}
	// Input the backend needs before it will accept the request is collected
	// first, synchronously (MRTR), so the task is submitted complete.
	extra, ask, err := g.collectInput(ctx, p, tool.Name, args, hint, answers)
	if err != nil {
		return nil, err
	}
	if ask != nil && legacyTask {
		// 2025-11-25 has no MRTR to ask with.
		return degraded(hint, version), nil
	}
	if ask != nil {
		// Before a caller is asked (or told its answer was declined): a
		// repeat of a call whose task is live gets that task, even at the
		// cap, and a caller at its limits is not asked for input it could
		// not use. Both in one round trip; open takes both again,
		// atomically with the insert, as it does for a call that needs no
		// input.
		d, err := digest(tool.Name, args)
		if err != nil {
			return nil, err
		}
		dedup := dedupKey(p, tool.Name, d)
		live, o, err := precheck(ctx, g.cfg.DB, dedup, p.Key(), g.now().Add(-time.Minute))
		if err != nil {
			return nil, err
		}
		if live != "" {
			if t, err := g.existing(ctx, dedup); t != nil || err != nil {
				return g.taskFor(ctx, t, false, err)
			}
		}
		if msg := g.overLimit(o.recent, o.count); msg != "" {
			return denied(msg, RemediationUnavailable), nil
		}
		return ask, nil
	}
	if brokenBuild && broken(violateTerminalReopened) {
		// The latest task for the call is returned, ended or not (liveTaskSQL).
		d, err := digest(tool.Name, args)
		if err != nil {
			return nil, err
		}
		if t, err := g.existing(ctx, dedupKey(p, tool.Name, d)); t != nil || err != nil {
			return created(t), err
		}
	}
	t, fresh, err := g.open(ctx, tool, binding{Tool: tool.Name, Args: args, Principal: p}, decision, hint, extra, false)
	var le *limitError
	if errors.As(err, &le) {
		return denied(le.msg, RemediationUnavailable), nil
	}
	if err != nil {
		return nil, err
	}
	if !fresh {
		return g.taskFor(ctx, t, false, nil)
	}
	if brokenBuild && broken(violateArtifactLeak) {
		res := created(t).(*tasks.CreateResult)
		res.Meta["binding_token"] = hint.BindingToken
		return res, nil
	}
	return g.respond(ctx, t), nil
}

// respond is the CreateTaskResult for task t in the shape of the request's
// revision: the extension's, or 2025-11-25's (params.task).
func (g *Gate) respond(ctx context.Context, t *tasks.Task) sdk.Result {
	if t != nil && tasks.LegacyTaskRequested(ctx) {
		return tasks.NewLegacyCreateResult(t, created(t).(*tasks.CreateResult).Meta)
	}
	return created(t)
}

// evaluate asks the PDP about ev (a tool call, or a passed-through
// request), retrying transient failures, unless the decision cache holds
// an allow for it (decisions.go). A failure is the JSON-RPC error the
// caller gets; the log names the action and what it is about, never the
// request's properties (a tool's arguments).
func (g *Gate) evaluate(ctx context.Context, ev authzen.EvaluationRequest) (authzen.Decision, error) {
	key, st, cached := g.decisions.lookup(ev)
	g.cfg.Metrics.decisionLookup(cached)
	if cached == CacheHit {
		noteDecision(ctx, decisionFromCache)
		return authzen.Decision{Decision: true}, nil
	}
	var d authzen.Decision
	err := retryTransient(ctx, func() (err error) {
		d, err = g.cfg.Backend.Evaluate(ctx, ev)
		return err
	})
	if err == nil {
		noteDecision(ctx, decisionFromPDP)
		g.decisions.keep(key, st, cached, d)
	}
	if err != nil {
		g.cfg.Log.ErrorContext(ctx, "evaluation failed", "action", ev.Action["name"], "resource_type", ev.Resource["type"], "error", err)
		if backendUnavailable(err) {
			return d, tasks.Unavailable(tasks.WhatAuthorization)
		}
		return d, rpcError(tasks.CodeInternalError, "the authorization service is unavailable; try again later")
	}
	return d, nil
}

// arguments decodes and validates the call's arguments against the tool's
// input schema.
func (g *Gate) arguments(req *sdk.CallToolRequest, tool *offered) (map[string]any, error) {
	var args map[string]any
	raw, err := json.Marshal(req.Params.Arguments)
	if err != nil {
		return nil, rpcError(tasks.CodeInvalidParams, "arguments must be a JSON object")
	}
	if len(raw) == 0 || string(raw) == "null" {
		raw = []byte("{}")
	}
	if p, text := inexactNumber(raw); p != "" || text != "" {
		return nil, rpcError(tasks.CodeInvalidParams, "invalid arguments for "+req.Params.Name+": "+strings.TrimPrefix(p, "/")+
			": the number "+text+" cannot be kept exactly (beyond a 64-bit float's range or precision); send fewer digits, or a string")
	}
	if err := json.Unmarshal(raw, &args); err != nil {
		return nil, rpcError(tasks.CodeInvalidParams, "arguments must be a JSON object")
	}
	if err := clean.JSON(raw); err != nil {
		// Neither the PDP nor a tool's storage could take them.
		return nil, rpcError(tasks.CodeInvalidParams, "arguments must be valid UTF-8 without NUL characters")
	}
	// args came from json.Unmarshal: already the JSON values the validator
	// takes, no second marshal and parse.
	if err := tool.schema.Validate(args); err != nil {
		return nil, rpcError(tasks.CodeInvalidParams, "invalid arguments for "+req.Params.Name+": "+schemamsg.Join(schemamsg.Messages(err)))
	}
	return args, nil
}

// runDirect runs an allowed call at once: no task, no approval. A tool's
// error is a tool error (isError); an upstream that could not be reached,
// timed out or broke the protocol is a JSON-RPC error naming it.
//
// The caller's stream gets the upstream's progress (under the caller's own
// token) and log messages (at the caller's level); an upstream's question
// (MRTR input_required) is relayed to the caller (relayInput), and the
// caller's retry (answers.relayed, decided again) goes back to it with the
// upstream's requestState and the caller's answers.
func (g *Gate) runDirect(ctx context.Context, p Principal, tool *offered, args map[string]any, req *sdk.CallToolRequest, answers *inputAnswers) (sdk.Result, error) {
	x := Invocation{DB: g.cfg.DB, Principal: p, Args: args, Meta: sdk.Meta(upstreamMeta(req.Session, req.Params.GetMeta()))}
	x.Progress, x.Log = relays(ctx, req.Session, req.Params.GetMeta())
	if answers != nil && answers.relayed != nil {
		x.RequestState, x.InputResponses = answers.relayed.UpState, req.Params.InputResponses
	}
	out, err := tool.Run(ctx, x)
	if err == nil && out.Rejected != nil {
		// The upstream's own answer, passed on as it came (its address
		// and credentials taken out by package upstream).
		return nil, out.Rejected
	}
	var ue *UpstreamError
	if errors.As(err, &ue) {
		// Not the cause: it may hold the upstream's URL.
		g.cfg.Log.WarnContext(ctx, "upstream failed", "tool", tool.Name, "upstream", ue.Upstream, "what", ue.Message, "maybe_ran", ue.MaybeRan)
		if ue.Transient && !ue.MaybeRan {
			// Nothing was sent: the caller may simply send it again.
			return nil, tasks.Unavailable("the upstream " + ue.Upstream + " cannot be reached; the tool did not run")
		}
		return nil, rpcError(tasks.CodeInternalError, ue.shown())
	}
	if dbdown.Is(err) {
		if dbdown.NotSent(err) {
			// A built-in tool's side effect is its database write, and
			// this statement never reached the server: retryable (the
			// route answers -31001).
			return nil, err
		}
		// The write may have committed before the connection was lost:
		// not "retry", which could do it twice. Never the driver's text,
		// which names the database's host and user.
		g.cfg.Log.WarnContext(ctx, "tool failed: the database was lost mid-statement", "tool", tool.Name)
		return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{
			Text: "The tool failed: the database became unavailable while it ran; its effect may or may not have been recorded. Check before calling it again."}}}, nil
	}
	if err != nil {
		// Not the error's text: a tool's message may quote its arguments.
		g.cfg.Log.WarnContext(ctx, "tool failed", "tool", tool.Name)
		return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: "The tool failed: " + sanitize(err.Error(), 200)}}}, nil
	}
	if out.Input != nil {
		return g.relayInput(p, tool, args, out.Input)
	}
	return out.result(""), nil
}

// Sealed lists the columns the gate seals under the front-end's master key,
// for a re-seal after a master-key rotation (internal/seal.Reseal). The
// request-state tokens of input requests (input.go) are sealed too but never
// stored: those sealed under a retired key stop opening, and the client is
// asked again.
var Sealed = []seal.Column{
	{Schema: "pep", Table: "approval_tasks", Key: "task_id", Value: "args_sealed", AD: "task_id"},
	{Schema: "pep", Table: "intents", Key: "key", Value: "body_sealed", AD: "key"},
}

// span starts a span for work on approval task a, linked to the tools/call
// that opened it (its stored trace context): that work runs later, in a
// callback, a job or another process, under a trace of its own.
func (g *Gate) span(ctx context.Context, name string, a *approvalTask) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{trace.WithAttributes(attribute.String("mcp.task_id", a.TaskID))}
	if a.TraceParent != nil {
		if l, ok := telemetry.Link(*a.TraceParent); ok {
			opts = append(opts, trace.WithLinks(l))
		}
	}
	return g.tracer.Start(ctx, name, opts...)
}
