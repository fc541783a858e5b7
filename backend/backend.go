// Package backend assembles the approval backend (`arapd serve`): the
// database pool, signing keys, policy engine, request service, River workers
// and the HTTP server, with an orderly Start and Stop. It holds no logic of its
// own; everything it wires is tested in its own package.
package backend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/omcp/arap/arap"
	"github.com/omcp/arap/attributes"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/callbacks"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/directory"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/internal/logs"
	"github.com/omcp/arap/internal/ratelimit"
	"github.com/omcp/arap/migrations"
	"github.com/omcp/arap/requests"
	"github.com/omcp/arap/signing"
	"github.com/omcp/arap/webui"
)

// Config configures the backend.
type Config struct {
	// Addr is the listen address, e.g. "127.0.0.1:8480" (":0" picks a port).
	Addr string
	// PublicURL is the base URL clients use; derived from Addr when empty.
	PublicURL   string
	DatabaseURL string
	PolicyFile  string
	// MasterKey (32 bytes) seals signing keys in the database.
	MasterKey []byte
	// Migrate applies pending migrations at start.
	Migrate bool
	// Workers is the number of concurrent River jobs; default 20.
	Workers int
	Limits  arap.Limits
	Log     *slog.Logger
	// RequestRetention, if set, overrides how long ended requests stay readable.
	RequestRetention time.Duration
	// CallbackSchedule, if set, overrides the callback retry schedule.
	CallbackSchedule []time.Duration
	// Now is the web UI's clock (sessions, sign-in throttling); time.Now
	// when nil. Tests move it instead of waiting.
	Now func() time.Time
	// JobTimeout bounds a background job (default 1 minute); a job still
	// marked running after twice that (its worker died: kill -9) is retried.
	JobTimeout time.Duration
	// RateLimitClock, if set, is the rate limits' clock (tests pin it, so
	// that no window ends in the middle of a test).
	RateLimitClock func() time.Time
}

// Backend is a running (or ready to run) backend.
type Backend struct {
	cfg       Config
	pool      *pgxpool.Pool
	river     *river.Client[pgx.Tx]
	engine    *evaluation.Engine
	requests  *requests.Service
	keys      *signing.Keys
	clients   *clients.Store
	people    *directory.Store
	attrs     *attributes.Store
	callbacks *callbacks.Service
	server    *http.Server
	listener  net.Listener
	started   atomic.Bool
	stopping  atomic.Bool
	serveErr  chan error
}

// New connects to the database and builds every part; nothing listens or
// runs jobs until Start.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Workers == 0 {
		cfg.Workers = 20
	}
	if cfg.JobTimeout == 0 {
		cfg.JobTimeout = time.Minute
	}
	if cfg.DatabaseURL == "" {
		return nil, errors.New("backend: a database URL is required (--database-url or DATABASE_URL)")
	}
	if cfg.PolicyFile == "" {
		return nil, errors.New("backend: a policy file is required (--policy)")
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("backend: listen on %s: %w", cfg.Addr, err)
	}
	b := &Backend{cfg: cfg, listener: ln, serveErr: make(chan error, 1)}
	if err := b.build(ctx); err != nil {
		_ = ln.Close()
		b.closePool()
		return nil, err
	}
	return b, nil
}

func (b *Backend) build(ctx context.Context) error {
	cfg := b.cfg
	public := strings.TrimRight(cfg.PublicURL, "/")
	if public == "" {
		public = "http://" + b.listener.Addr().String()
	}
	if u, err := url.Parse(public); err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return fmt.Errorf("backend: public URL %q must be an absolute http(s) URL", cfg.PublicURL)
	}
	if !strings.HasPrefix(public, "https://") && !isLoopback(public) {
		cfg.Log.Warn("public URL is not https; ARAP requires HTTPS endpoints outside local development", "public_url", public)
	}
	b.cfg.PublicURL = public

	var err error
	if b.pool, err = migrations.Open(ctx, cfg.DatabaseURL, cfg.Migrate, cfg.Log); err != nil {
		return fmt.Errorf("backend: %w", err)
	}
	if b.keys, err = signing.Open(ctx, b.pool, signing.Options{MasterKey: cfg.MasterKey}); err != nil {
		return err
	}
	requestsURL := public + authzen.PathRequests
	b.attrs = attributes.NewStore(b.pool)
	b.people = directory.NewStore(b.pool)
	if b.engine, err = evaluation.New(evaluation.Options{
		PolicyFile: cfg.PolicyFile, Keys: b.keys, Issuer: public, RequestsURL: requestsURL,
		SchemaURL:  func(tpl string) string { return public + authzen.PathSchemas + "/" + url.PathEscape(tpl) },
		Attributes: b.attrs,
		Approvals:  &requests.ApprovalStore{DB: b.pool, Now: time.Now},
		Log:        cfg.Log,
	}); err != nil {
		return err
	}
	// Jobs are inserted through a client without workers, so the services can
	// be built before the worker client that needs them.
	riverLog := logs.Quiet(cfg.Log, slog.LevelWarn)
	inserter, err := river.NewClient(riverpgxv5.New(b.pool), &river.Config{Schema: migrations.RiverSchema, Logger: riverLog})
	if err != nil {
		return fmt.Errorf("backend: river: %w", err)
	}
	statusEndpoint := func(id string) string { return requestsURL + "/" + id }
	if b.callbacks, err = callbacks.NewService(callbacks.Config{
		DB: b.pool, Jobs: inserter, MasterKey: cfg.MasterKey, StatusEndpoint: statusEndpoint,
		Schedule: cfg.CallbackSchedule, Log: cfg.Log,
	}); err != nil {
		return err
	}
	if err := prometheus.Register(b.callbacks.QueueDepth()); err != nil && !errors.As(err, &prometheus.AlreadyRegisteredError{}) {
		return err
	}
	if b.requests, err = requests.NewService(requests.Config{
		DB: b.pool, Jobs: inserter, Keys: b.keys, Policy: b.engine, Issuer: public, RequestsURL: requestsURL,
		Retention: cfg.RequestRetention, Log: cfg.Log,
		CheckCallback: b.callbacks.CheckCallback, OnTerminal: b.callbacks.OnTerminal,
	}); err != nil {
		return err
	}
	b.clients = clients.NewStore(b.pool)
	counters := ratelimit.NewCounters(b.pool, pgx.Identifier{"arap", "rate_counters"})
	counters.Now = cfg.RateLimitClock

	workers := river.NewWorkers()
	b.requests.AddWorkers(workers)
	b.callbacks.AddWorkers(workers)
	counters.AddWorker(workers)
	if b.river, err = river.NewClient(riverpgxv5.New(b.pool), &river.Config{
		Schema:  migrations.RiverSchema,
		Logger:  riverLog,
		Workers: workers,
		Queues: map[string]river.QueueConfig{
			river.QueueDefault:        {MaxWorkers: cfg.Workers},
			requests.QueueMaintenance: {MaxWorkers: requests.MaintenanceWorkers},
		},
		PeriodicJobs: append(b.requests.PeriodicJobs(), counters.PeriodicJob(&river.InsertOpts{Queue: requests.QueueMaintenance})),
		JobTimeout:   cfg.JobTimeout,
		// A callback delivery is a job, and its pickup delay is the
		// approve-to-complete latency of every PEP: River's insert
		// notifications are debounced and its default poll is 1 s, which
		// left p99 near 800 ms (arapbench). A 50 ms poll costs a replica 20
		// small queries a second. FetchCooldown (default 100 ms) spaces
		// fetches and, with MaxWorkers per fetch, caps a replica's job rate.
		FetchPollInterval: 50 * time.Millisecond,
		FetchCooldown:     10 * time.Millisecond,
		// A job whose worker died (kill -9) is retried after this.
		RescueStuckJobsAfter: 2 * cfg.JobTimeout,
	}); err != nil {
		return fmt.Errorf("backend: river: %w", err)
	}

	origin, _ := url.Parse(public)
	ui, err := webui.New(webui.Deps{
		DB: b.pool, Requests: b.requests, Directory: b.people, Counters: counters,
		Secure: origin.Scheme == "https", Now: cfg.Now, Log: cfg.Log,
	})
	if err != nil {
		return err
	}
	h, err := arap.New(arap.Deps{
		PublicURL: public, Clients: b.clients, Engine: b.engine, Requests: b.requests, Keys: b.keys, Callbacks: b.callbacks,
		Counters: counters, Limits: cfg.Limits, Log: cfg.Log, Ready: b.ready, UI: ui,
	})
	if err != nil {
		return err
	}
	b.server = arap.HTTPServer(h)
	return nil
}

func isLoopback(u string) bool {
	p, err := url.Parse(u)
	if err != nil {
		return false
	}
	host := p.Hostname()
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}

// Start runs the job workers and begins serving HTTP.
func (b *Backend) Start(ctx context.Context) error {
	if err := b.river.Start(ctx); err != nil {
		return fmt.Errorf("backend: start workers: %w", err)
	}
	go func() { b.serveErr <- b.server.Serve(b.listener) }()
	b.started.Store(true)
	b.cfg.Log.Info("backend started", "addr", b.listener.Addr().String(), "public_url", b.cfg.PublicURL,
		"policy", b.cfg.PolicyFile, "rules", len(b.engine.Policy().Rules), "signing_key", b.keys.ActiveKid())
	return nil
}

// Done reports a fatal serving error.
func (b *Backend) Done() <-chan error { return b.serveErr }

// Stop drains HTTP (in-flight requests finish, new connections are
// refused), then stops the workers (running jobs finish or are abandoned to
// be rescued by another replica), then closes the pool.
func (b *Backend) Stop(ctx context.Context) error {
	b.stopping.Store(true)
	var errs []error
	if err := b.server.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("http shutdown: %w", err))
	}
	if b.started.Load() {
		if err := b.river.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop workers: %w", err))
		}
	}
	b.closePool()
	b.cfg.Log.Info("backend stopped")
	return errors.Join(errs...)
}

func (b *Backend) closePool() {
	if b.pool != nil {
		b.pool.Close()
	}
}

func (b *Backend) ready(ctx context.Context) error {
	if b.stopping.Load() {
		return errors.New("shutting down")
	}
	if !b.started.Load() {
		return errors.New("starting")
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := b.pool.Ping(ctx); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	return nil
}

// Reload re-reads the policy file; on error the running policy stays.
func (b *Backend) Reload() error {
	if err := b.engine.Reload(); err != nil {
		b.cfg.Log.Error("policy reload rejected; keeping the current policy", "error", err.Error())
		return err
	}
	b.cfg.Log.Info("policy reloaded", "policy", b.cfg.PolicyFile, "rules", len(b.engine.Policy().Rules))
	return nil
}

// URL is the backend's public base URL.
func (b *Backend) URL() string { return b.cfg.PublicURL }

// Addr is the address the backend listens on.
func (b *Backend) Addr() string { return b.listener.Addr().String() }

// Pool is the backend's database pool (for dev-mode seeding and tests).
func (b *Backend) Pool() *pgxpool.Pool { return b.pool }

// Clients is the API client store.
func (b *Backend) Clients() *clients.Store { return b.clients }

// Keys are the signing keys.
func (b *Backend) Keys() *signing.Keys { return b.keys }

// Directory is the user and group store.
func (b *Backend) Directory() *directory.Store { return b.people }

// Attributes is the attribute store.
func (b *Backend) Attributes() *attributes.Store { return b.attrs }

// Requests is the access request service.
func (b *Backend) Requests() *requests.Service { return b.requests }

// Callbacks is the callback service.
func (b *Backend) Callbacks() *callbacks.Service { return b.callbacks }

// Engine is the policy decision point.
func (b *Backend) Engine() *evaluation.Engine { return b.engine }

// Run starts the backend and serves until ctx ends (SIGTERM), reloading the
// policy on every value from reload (SIGHUP). It then stops gracefully,
// giving in-flight work up to 30 seconds.
func (b *Backend) Run(ctx context.Context, reload <-chan struct{}) error {
	if err := b.Start(ctx); err != nil {
		return err
	}
	var serveErr error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-reload:
			_ = b.Reload()
		case err := <-b.serveErr:
			if !errors.Is(err, http.ErrServerClosed) {
				serveErr = fmt.Errorf("backend: serve: %w", err)
			}
			break loop
		}
	}
	b.cfg.Log.Info("shutting down")
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	return errors.Join(serveErr, b.Stop(stopCtx))
}
