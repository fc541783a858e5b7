// Package frontend assembles the MCP front-end (`arapd mcp`): River workers
// on their own schema, the approval gate, task notifications, the
// reconciler and the MCP server, on an internal/host that owns the
// listener, pool and lifecycle. Like package backend it holds no logic of
// its own, and it links no backend package: it reaches the backend over
// HTTP (boundary_test.go).
package frontend

import (
	"github.com/omcp/arap/internal/telemetry"
	"go.opentelemetry.io/otel/trace"
	"net/http"

	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/riverqueue/river"

	"github.com/omcp/arap/agentauth"
	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/internal/durability"
	"github.com/omcp/arap/internal/host"
	"github.com/omcp/arap/internal/ratelimit"
	"github.com/omcp/arap/internal/seal"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/migrations"
	"github.com/omcp/arap/pep"
	"github.com/omcp/arap/upstream"
)

// Config configures the front-end.
type Config struct {
	Addr string
	// PublicURL is this server's base URL as the backend reaches it (for
	// callbacks); derived from Addr when empty.
	PublicURL   string
	DatabaseURL string
	// ListenURL, when set, is a direct connection to PostgreSQL for LISTEN
	// and migrations, DatabaseURL then going through a transaction-mode
	// pooler (host.Config.ListenURL, --database-listen-url).
	ListenURL string
	// MasterKey (32 bytes) seals stored arguments and submission bodies.
	MasterKey []byte
	// PreviousMasterKeys (32 bytes each) open values sealed before a master-key
	// rotation; they never seal.
	PreviousMasterKeys [][]byte
	// BackendURL and BackendToken reach the PDP and Access Request Service.
	BackendURL   string
	BackendToken string
	// WebhookSecrets verify the backend's callbacks; none: poll only.
	WebhookSecrets []string
	// TrustedProxies are the reverse proxies whose X-Forwarded-For names
	// the client (--trusted-proxies).
	TrustedProxies []netip.Prefix
	Migrate        bool
	// Tools are the built-in tools (the demo tools, pep.DemoTools, under
	// arapd dev or --demo-tools; none in production); Sources offer more
	// (upstream MCP servers), read on every call. A name offered by two of
	// them at startup is refused. A front-end given no tools, no sources,
	// no upstreams file and no Extra does not start (ErrNoTools).
	Tools   []pep.Tool
	Sources []pep.ToolSource
	// ApprovalTools offers approval as ordinary tools to clients that do
	// not drive tasks (pep.Config.ApprovalTools; --approval-tools).
	ApprovalTools bool
	// OAuth, when set, admits callers with the OAuth access tokens of the
	// authorization servers it names (MCP authorization; package
	// agentauth), beside arap's caller tokens; its Resource defaults to
	// the public URL's /mcp.
	OAuth *agentauth.Config
	// Upstreams is the upstreams file (package upstream): MCP servers whose
	// tools are offered after the built-in ones, decided by the PDP and
	// forwarded at most once. Reloaded on SIGHUP; "" for none.
	Upstreams string
	// Gate tuning (zero values take the gate's defaults).
	PollInterval time.Duration
	ExecTimeout  time.Duration
	MaxWindow    time.Duration
	// IntentGrace is how long an unbound intent is left to the process
	// that wrote it before the reconciler takes it over (default 15s).
	IntentGrace time.Duration
	// ReconcileEvery is how often crash leftovers are repaired (default 10s).
	ReconcileEvery time.Duration
	// DecisionCache bounds the allowed decisions the gate reuses while it
	// hears the backend's change stream (pep.Config.DecisionCache; default
	// 10,000, negative: off, --decision-cache); DecisionMaxAge bounds how
	// long one is reused (default 1 minute, --decision-cache-max-age).
	DecisionCache  int
	DecisionMaxAge time.Duration
	// ListenStreams bounds the subscriptions/listen streams one caller may
	// hold open on this process (default 10); ListenLifetime ends each
	// stream (default 30 minutes).
	ListenStreams  int
	ListenLifetime time.Duration
	// Extra registers more tools or methods (conformance fixtures).
	Extra func(s *sdk.Server, ts *tasks.Server) error
	// Anonymous is the principal of requests without an Authorization
	// header (conformance fixture mode only; nil in production).
	Anonymous *pep.Principal
	// Stopping, when set, is called by Stop once HTTP has drained and
	// before the workers stop and the pool closes (the conformance
	// fixtures settle their running tasks there).
	Stopping func()
	// UpstreamsReady reports the upstream MCP servers that cannot serve
	// now, by configured name; /readyz names each upstream:<name>.
	UpstreamsReady func(ctx context.Context) map[string]error
	// Metrics are the front-end's metrics (served at /metrics); fresh ones
	// when nil. Made before New, they can be handed to the upstream
	// clients too (Metrics.ObserveUpstream).
	Metrics *pep.Metrics
	Log     *slog.Logger
	// issue21-obs
	// MetricsAddr, if set, serves /metrics there only (not on Addr).
	MetricsAddr string
	// TracerProvider traces requests, the backend calls and jobs; the
	// global provider (set up from OTEL_* by telemetry.FromEnv) when nil.
	TracerProvider trace.TracerProvider
}

// ErrNoTools is New's refusal of a front-end with nothing to offer: the
// demo tools are never a default, so that no agent in production sees a
// wire_transfer that only pretends to pay.
var ErrNoTools = errors.New("frontend: no tools to offer: give --upstreams FILE (ARAP_UPSTREAMS), the MCP servers whose tools this gateway decides on; " +
	"to try arap without one, --demo-tools (ARAP_DEMO_TOOLS=true) offers the demo tools, whose side effects are rows in a ledger table (never in production)")

// Frontend is a running (or ready to run) MCP front-end.
type Frontend struct {
	cfg       Config
	gate      *pep.Gate
	host      *host.Host
	upstreams *upstream.Registry // nil without Config.Upstreams
}

// New connects and builds everything; nothing runs until Start.
func New(ctx context.Context, cfg Config) (*Frontend, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.DatabaseURL == "" || cfg.BackendURL == "" || cfg.BackendToken == "" {
		return nil, errors.New("frontend: database URL, backend URL and backend token are required")
	}
	if len(cfg.Tools) == 0 && len(cfg.Sources) == 0 && cfg.Upstreams == "" && cfg.Extra == nil {
		return nil, ErrNoTools
	}
	if cfg.Metrics == nil {
		cfg.Metrics = pep.NewMetrics()
	}
	h, err := host.New(ctx, host.Config{Name: "mcp front-end", Addr: cfg.Addr, PublicURL: cfg.PublicURL, DatabaseURL: cfg.DatabaseURL, ListenURL: cfg.ListenURL, Migrate: cfg.Migrate, Log: cfg.Log,
		Key: "frontend", Metrics: cfg.Metrics, MetricsAddr: cfg.MetricsAddr, TracerProvider: cfg.TracerProvider})
	if err != nil {
		return nil, fmt.Errorf("frontend: %w", err)
	}
	f := &Frontend{cfg: cfg, host: h}
	if err := f.build(ctx); err != nil {
		if f.upstreams != nil {
			_ = f.upstreams.Close(ctx)
		}
		h.Close()
		return nil, err
	}
	return f, nil
}

func (f *Frontend) build(ctx context.Context) (err error) {
	cfg, pool := f.cfg, f.host.Pool()
	callbackURL := ""
	if len(cfg.WebhookSecrets) > 0 {
		callbackURL = f.host.URL() + pep.PathCallback
	}
	sources := cfg.Sources
	if cfg.Upstreams != "" {
		if err := f.connectUpstreams(ctx, cfg.Metrics); err != nil {
			return err
		}
		sources = append(slices.Clone(sources), pep.NewUpstreams(f.upstreams, cfg.Metrics))
		if len(cfg.Tools) == 0 && len(cfg.Sources) == 0 && cfg.Extra == nil && len(f.upstreams.Ready()) == 0 {
			cfg.Log.Warn("no tools are offered: the upstreams file lists no upstream; add the MCP servers this gateway decides on and reload (SIGHUP)", "upstreams", cfg.Upstreams)
		}
		if f.cfg.UpstreamsReady == nil {
			f.cfg.UpstreamsReady = func(context.Context) map[string]error { return f.upstreams.Ready() }
		}
	}
	if f.gate, err = pep.NewGate(pep.Config{
		DB: pool, MasterKey: cfg.MasterKey, PreviousMasterKeys: cfg.PreviousMasterKeys, TracerProvider: cfg.TracerProvider,
		Backend: &arapclient.Client{BaseURL: cfg.BackendURL, Token: cfg.BackendToken,
			HTTP: &http.Client{Timeout: 30 * time.Second, Transport: telemetry.Transport(arapclient.Pooled(), cfg.TracerProvider)}},
		CallbackURL: callbackURL, Tools: cfg.Tools, Sources: sources, ApprovalTools: cfg.ApprovalTools, PollInterval: cfg.PollInterval, ExecTimeout: cfg.ExecTimeout, MaxWindow: cfg.MaxWindow,
		IntentGrace: cfg.IntentGrace, ReconcileEvery: cfg.ReconcileEvery, Metrics: cfg.Metrics, Log: cfg.Log,
		DecisionCache: cfg.DecisionCache, DecisionMaxAge: cfg.DecisionMaxAge,
	}); err != nil {
		return err
	}
	counters := ratelimit.NewCounters(pool, pep.RateCounters)
	workers := river.NewWorkers()
	f.gate.AddWorkers(workers)
	counters.AddWorker(workers)
	// The front-end's River jobs are its purges (and older versions'
	// tracking jobs, handed to the look sweep): nothing on a call's path.
	jobs, err := f.host.River(&river.Config{
		Schema: migrations.PEPRiverSchema, Workers: workers,
		Queues:               map[string]river.QueueConfig{pep.Queue: {MaxWorkers: 4}},
		PeriodicJobs:         append(f.gate.PeriodicJobs(), counters.PeriodicJob(&river.InsertOpts{Queue: pep.Queue})),
		RescueStuckJobsAfter: 2 * time.Minute, // twice River's default job timeout
	})
	if err != nil {
		return fmt.Errorf("frontend: %w", err)
	}
	notifier := tasks.NewNotifier(pool, tasks.ListenConfig{MaxStreams: cfg.ListenStreams, MaxLifetime: cfg.ListenLifetime, Log: cfg.Log})
	var agents *agentauth.Verifier
	if cfg.OAuth != nil {
		oc := *cfg.OAuth
		if oc.Resource == "" {
			oc.Resource = f.host.URL() + pep.PathMCP
		}
		if agents, err = agentauth.New(oc); err != nil {
			return err
		}
	}
	srv, err := pep.NewServer(f.gate, pep.ServerOptions{Agents: agents, Name: "arap-mcp", Version: "0.1.0", WebhookSecrets: cfg.WebhookSecrets, TrustedProxies: cfg.TrustedProxies, MetricsElsewhere: cfg.MetricsAddr != "",
		Counters: counters, Replay: &pep.WebhookIDs{DB: pool}, Extra: cfg.Extra, Anonymous: cfg.Anonymous, Notifier: notifier, Ready: f.ready, Upstreams: f.upstreams, Log: cfg.Log})
	if err != nil {
		return err
	}
	f.host.Mount(host.Parts{
		Handler: srv, Metrics: cfg.Metrics.Handler(cfg.Log), Workers: jobs,
		// They stop in reverse once HTTP has drained: the notifier (its
		// streams already ended by OnShutdown), then the Stopping hook,
		// then the gate (its callback wake-ups, looks, sweep and
		// reconciler, waited for); the workers after them. The upstream
		// sessions close after the workers (Stop, Run): a look still
		// running must not find its upstream gone.
		Services: []host.Service{f.gate, stopping(cfg.Stopping), notifier},
		Reload:   f.reloadUpstreams,
		// Shutdown waits for open requests, and a listen stream never ends
		// by itself: ending them is the first thing Shutdown does.
		OnShutdown: []func(){notifier.Stop},
		// The master key's id (which says nothing about the key) shows which
		// key each replica seals under during a rotation.
		Started: func() []any {
			return []any{"mcp", f.host.URL() + pep.PathMCP, "backend", cfg.BackendURL, "master_key_id", seal.KeyID(cfg.MasterKey)}
		},
	})
	return nil
}

// ready checks, at once, the process and its database (host.Probe, which
// also reports the database's durability), the backend, and every
// upstream, and names those that fail.
func (f *Frontend) ready(ctx context.Context) (map[string]error, *durability.Report) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second) // a probe's answer is worth little later
	defer cancel()
	var mu sync.Mutex
	failing := map[string]error{}
	fail := func(name string, err error) {
		mu.Lock()
		failing[name] = err
		mu.Unlock()
	}
	var database *durability.Report
	var wg sync.WaitGroup
	wg.Go(func() {
		report, err := f.host.Probe(ctx)
		if errors.Is(err, host.ErrDatabase) {
			fail("database", err)
		} else if err != nil {
			fail("process", err) // starting, or shutting down
		}
		database = report
	})
	wg.Go(func() {
		if err := f.gate.BackendReady(ctx); err != nil {
			fail("backend", err)
		}
	})
	if f.cfg.UpstreamsReady != nil {
		wg.Go(func() {
			for name, err := range f.cfg.UpstreamsReady(ctx) {
				if err != nil {
					fail("upstream:"+name, err)
				}
			}
		})
	}
	wg.Wait()
	return failing, database
}

// connectUpstreams reads the upstreams file and connects its servers; an
// upstream that cannot be reached now is retried (and named by /readyz),
// a bad file or two tools under one name are refused.
func (f *Frontend) connectUpstreams(ctx context.Context, m *pep.Metrics) error {
	ucfg, err := upstream.Load(f.cfg.Upstreams)
	if err != nil {
		return fmt.Errorf("frontend: %w", err)
	}
	var reserved []string
	for _, t := range f.cfg.Tools {
		reserved = append(reserved, t.Name)
	}
	f.upstreams = upstream.New(upstream.Options{
		Logger: f.cfg.Log, Client: &sdk.Implementation{Name: "arapd", Version: "0.1.0"}, Reserved: reserved,
		// The server follows the registry's changes itself (pep.NewServer).
	})
	if err := f.upstreams.Reload(ctx, ucfg); err != nil {
		return fmt.Errorf("frontend: %w", err)
	}
	return nil
}

// reloadUpstreams reads the upstreams file again (SIGHUP): a bad file or a
// name collision is refused and the running set stays; upstreams left
// unchanged keep their sessions and their calls in flight.
func (f *Frontend) reloadUpstreams() {
	if f.upstreams == nil {
		return
	}
	ucfg, err := upstream.Load(f.cfg.Upstreams)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err = f.upstreams.Reload(ctx, ucfg)
		cancel()
	}
	if err != nil {
		f.cfg.Log.Error("upstreams not reloaded; the running set stays", "error", err.Error())
		return
	}
	f.cfg.Log.Info("upstreams reloaded", "file", f.cfg.Upstreams)
}

func (f *Frontend) closeUpstreams() {
	if f.upstreams == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = f.upstreams.Close(ctx)
}

// stopping runs a function (closing the upstreams, Config.Stopping) as a
// host service stops.
type stopping func()

func (stopping) Start(context.Context) error { return nil }

func (s stopping) Stop() {
	if s != nil {
		s()
	}
}

// Start runs the workers and serves.
func (f *Frontend) Start(ctx context.Context) error {
	if err := f.host.Start(ctx); err != nil {
		return fmt.Errorf("frontend: %w", err)
	}
	return nil
}

// Stop drains HTTP, then stops the workers, closes the pool and the
// upstream sessions.
func (f *Frontend) Stop(ctx context.Context) error {
	defer f.closeUpstreams()
	return f.host.Stop(ctx)
}

// Run serves until ctx ends, then stops gracefully; every value from
// reload (SIGHUP; nil for none) reads the upstreams file again.
func (f *Frontend) Run(ctx context.Context, reload <-chan struct{}) error {
	defer f.closeUpstreams()
	if err := f.host.Run(ctx, reload); err != nil {
		return fmt.Errorf("frontend: %w", err)
	}
	return nil
}

// MetricsAddr is the address of the metrics listener (Config.MetricsAddr),
// "" without one.
func (f *Frontend) MetricsAddr() string { return f.host.MetricsAddr() }

// URL is the front-end's base URL; the MCP endpoint is URL()+"/mcp".
func (f *Frontend) URL() string { return f.host.URL() }

// Gate is the approval gate.
func (f *Frontend) Gate() *pep.Gate { return f.gate }

// Pool is the database pool.
func (f *Frontend) Pool() *pgxpool.Pool { return f.host.Pool() }
