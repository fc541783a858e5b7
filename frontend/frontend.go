// Package frontend assembles the MCP front-end (`arapd mcp`): its database
// pool, River workers on their own schema, the approval gate and the MCP
// server, with an orderly Start and Stop. Like package backend it holds no
// logic of its own.
package frontend

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/omcp/arap/arap"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/logs"
	"github.com/omcp/arap/internal/ratelimit"
	"github.com/omcp/arap/mcp"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/migrations"
)

// Config configures the front-end.
type Config struct {
	Addr string
	// PublicURL is this server's base URL as the backend reaches it (for
	// callbacks); derived from Addr when empty.
	PublicURL   string
	DatabaseURL string
	// MasterKey (32 bytes) seals stored arguments and submission bodies.
	MasterKey []byte
	// BackendURL and BackendToken reach the PDP and Access Request Service.
	BackendURL   string
	BackendToken string
	// WebhookSecrets verify the backend's callbacks; none: poll only.
	WebhookSecrets []string
	Migrate        bool
	Tools          []mcp.Tool
	// Gate tuning (zero values take the gate's defaults).
	PollInterval time.Duration
	ExecTimeout  time.Duration
	MaxWindow    time.Duration
	// JobTimeout bounds background jobs; a job whose worker died is retried
	// after twice this. Default: ExecTimeout plus 30s.
	JobTimeout time.Duration
	// ReconcileEvery is how often crash leftovers are repaired (default 10s).
	ReconcileEvery time.Duration
	// ListenStreams bounds the subscriptions/listen streams one caller may
	// hold open on this process (default 10); ListenLifetime ends each
	// stream (default 30 minutes).
	ListenStreams  int
	ListenLifetime time.Duration
	// Extra registers more tools or methods (conformance fixtures).
	Extra func(s *sdk.Server, ts *tasks.Server) error
	// Anonymous is the principal of requests without an Authorization
	// header (conformance fixture mode only; nil in production).
	Anonymous *mcp.Principal
	// Stopping, when set, is called by Stop once HTTP has drained and
	// before the workers stop and the pool closes (the conformance
	// fixtures settle their running tasks there).
	Stopping func()
	Log      *slog.Logger
}

// Frontend is a running (or ready to run) MCP front-end.
type Frontend struct {
	cfg        Config
	pool       *pgxpool.Pool
	river      *river.Client[pgx.Tx]
	gate       *mcp.Gate
	reconciler *mcp.Reconciler
	notifier   *tasks.Notifier
	server     *http.Server
	listener   net.Listener
	started    atomic.Bool
	serveErr   chan error
}

// New connects and builds everything; nothing runs until Start.
func New(ctx context.Context, cfg Config) (*Frontend, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.DatabaseURL == "" || cfg.BackendURL == "" || cfg.BackendToken == "" {
		return nil, errors.New("frontend: database URL, backend URL and backend token are required")
	}
	if cfg.Tools == nil {
		cfg.Tools = mcp.DemoTools()
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("frontend: listen on %s: %w", cfg.Addr, err)
	}
	f := &Frontend{cfg: cfg, listener: ln, serveErr: make(chan error, 1)}
	if err := f.build(ctx); err != nil {
		_ = ln.Close()
		if f.pool != nil {
			f.pool.Close()
		}
		return nil, err
	}
	return f, nil
}

func (f *Frontend) build(ctx context.Context) error {
	cfg := f.cfg
	public := strings.TrimRight(cfg.PublicURL, "/")
	if public == "" {
		public = "http://" + f.listener.Addr().String()
	}
	f.cfg.PublicURL = public
	var err error
	if f.pool, err = migrations.Open(ctx, cfg.DatabaseURL, cfg.Migrate, cfg.Log); err != nil {
		return fmt.Errorf("frontend: %w", err)
	}
	riverLog := logs.Quiet(cfg.Log, slog.LevelWarn)
	inserter, err := river.NewClient(riverpgxv5.New(f.pool), &river.Config{Schema: migrations.PEPRiverSchema, Logger: riverLog})
	if err != nil {
		return err
	}
	callbackURL := ""
	if len(cfg.WebhookSecrets) > 0 {
		callbackURL = public + mcp.PathCallback
	}
	if f.gate, err = mcp.NewGate(mcp.Config{
		DB: f.pool, Backend: &authzen.Client{BaseURL: cfg.BackendURL, Token: cfg.BackendToken}, MasterKey: cfg.MasterKey,
		CallbackURL: callbackURL, Jobs: inserter, Tools: cfg.Tools, PollInterval: cfg.PollInterval, ExecTimeout: cfg.ExecTimeout, MaxWindow: cfg.MaxWindow, Log: cfg.Log,
	}); err != nil {
		return err
	}
	jobTimeout := cfg.JobTimeout
	if jobTimeout == 0 {
		jobTimeout = max(cfg.ExecTimeout, 30*time.Second) + 30*time.Second
	}
	counters := ratelimit.NewCounters(f.pool, mcp.RateCounters)
	workers := river.NewWorkers()
	f.gate.AddWorkers(workers)
	counters.AddWorker(workers)
	if f.river, err = river.NewClient(riverpgxv5.New(f.pool), &river.Config{
		Schema: migrations.PEPRiverSchema, Logger: riverLog, Workers: workers,
		Queues:               map[string]river.QueueConfig{mcp.Queue: {MaxWorkers: 20}},
		PeriodicJobs:         append(f.gate.PeriodicJobs(), counters.PeriodicJob(&river.InsertOpts{Queue: mcp.Queue})),
		JobTimeout:           jobTimeout,
		RescueStuckJobsAfter: 2 * jobTimeout,
		FetchPollInterval:    200 * time.Millisecond,
	}); err != nil {
		return fmt.Errorf("frontend: river: %w", err)
	}
	f.notifier = tasks.NewNotifier(f.pool, tasks.ListenConfig{MaxStreams: cfg.ListenStreams, MaxLifetime: cfg.ListenLifetime, Log: cfg.Log})
	srv, err := mcp.NewServer(f.gate, mcp.ServerOptions{Name: "arap-mcp", Version: "0.1.0", WebhookSecrets: cfg.WebhookSecrets,
		Counters: counters, Replay: &mcp.WebhookIDs{DB: f.pool}, Extra: cfg.Extra, Anonymous: cfg.Anonymous, Notifier: f.notifier, Log: cfg.Log})
	if err != nil {
		return err
	}
	f.server = arap.HTTPServer(srv)
	// Shutdown waits for open requests, and a listen stream never ends by
	// itself: ending them is the first thing Shutdown does.
	f.server.RegisterOnShutdown(f.notifier.Stop)
	f.reconciler = &mcp.Reconciler{Gate: f.gate, Every: cmp.Or(cfg.ReconcileEvery, 10*time.Second)}
	return nil
}

// Start runs the workers and serves.
func (f *Frontend) Start(ctx context.Context) error {
	if err := f.notifier.Start(ctx); err != nil {
		return fmt.Errorf("frontend: start task notifications: %w", err)
	}
	if err := f.river.Start(ctx); err != nil {
		f.notifier.Stop()
		return fmt.Errorf("frontend: start workers: %w", err)
	}
	f.reconciler.Start()
	go func() { f.serveErr <- f.server.Serve(f.listener) }()
	f.started.Store(true)
	f.cfg.Log.Info("mcp front-end started", "addr", f.listener.Addr().String(), "mcp", f.cfg.PublicURL+mcp.PathMCP, "backend", f.cfg.BackendURL)
	return nil
}

// Stop drains HTTP, then stops the workers and closes the pool.
func (f *Frontend) Stop(ctx context.Context) error {
	var errs []error
	if err := f.server.Shutdown(ctx); err != nil {
		errs = append(errs, err)
	}
	f.notifier.Stop() // already by Shutdown, unless it never started
	if f.cfg.Stopping != nil {
		f.cfg.Stopping()
	}
	if f.started.Load() {
		f.reconciler.Stop()
		if err := f.river.Stop(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	f.pool.Close()
	f.cfg.Log.Info("mcp front-end stopped")
	return errors.Join(errs...)
}

// Run serves until ctx ends, then stops gracefully.
func (f *Frontend) Run(ctx context.Context) error {
	if err := f.Start(ctx); err != nil {
		return err
	}
	var serveErr error
	select {
	case <-ctx.Done():
	case err := <-f.serveErr:
		if !errors.Is(err, http.ErrServerClosed) {
			serveErr = err
		}
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	return errors.Join(serveErr, f.Stop(stopCtx))
}

// URL is the front-end's base URL; the MCP endpoint is URL()+"/mcp".
func (f *Frontend) URL() string { return f.cfg.PublicURL }

// Gate is the approval gate.
func (f *Frontend) Gate() *mcp.Gate { return f.gate }

// Pool is the database pool.
func (f *Frontend) Pool() *pgxpool.Pool { return f.pool }
