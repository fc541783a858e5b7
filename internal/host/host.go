// Package host runs one arapd process: it listens, opens the database pool
// (migrating it if asked), builds River clients on that pool, serves HTTP
// with the timeouts every listener should have, and starts and stops it all
// in order. `arapd serve` (package backend) and `arapd mcp` (package
// frontend) are each their wiring on a Host.
//
// The order is the point: Start runs the services, then the workers, then
// serves; Stop drains HTTP (new connections refused, requests in flight
// finish), stops the services in reverse, then the workers (running jobs
// finish or are left for another replica to rescue), then closes the pool.
package host

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
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/riverqueue/rivercontrib/otelriver"
	"go.opentelemetry.io/otel/trace"

	"github.com/omcp/arap/internal/dbdown"
	"github.com/omcp/arap/internal/durability"
	"github.com/omcp/arap/internal/logs"
	"github.com/omcp/arap/internal/pglisten"
	"github.com/omcp/arap/internal/telemetry"
	"github.com/omcp/arap/migrations"
)

// Config configures a Host.
type Config struct {
	// Name starts the host's log lines ("backend started").
	Name string
	// Addr is the listen address, e.g. "127.0.0.1:8480" (":0" picks a port).
	Addr string
	// PublicURL is the base URL others use; "http://" and the listen
	// address when empty.
	PublicURL   string
	DatabaseURL string
	// ListenURL, when set, connects to PostgreSQL directly, for what needs
	// a session of its own: every LISTEN (pglisten's and River's) and the
	// migrations (a session advisory lock). Set it when DatabaseURL goes
	// through a transaction-mode pooler (PgBouncer); the pool then also
	// uses no named prepared statements (default_query_exec_mode=
	// cache_describe, unless DatabaseURL says otherwise).
	ListenURL string
	// Migrate applies pending migrations before anything else.
	Migrate bool
	Log     *slog.Logger
	// Key names the process in metric labels ("backend", "frontend").
	Key string
	// Metrics is where the host registers its metrics (the pool's, the
	// jobs'); none when nil.
	Metrics Registerer
	// MetricsAddr, if set, is a second listener serving only GET /metrics
	// (Parts.Metrics); the Handler should then no longer serve it.
	MetricsAddr string
	// QuietJobs are the kinds of periodic jobs whose runs are not traced
	// (telemetry.QuietJobs): sweeps that mostly find nothing to do.
	QuietJobs []string
	// TracerProvider traces HTTP requests and jobs; the global provider
	// when nil.
	TracerProvider trace.TracerProvider
}

// Registerer takes collectors (prometheus.Registerer, pep.Metrics).
type Registerer interface {
	Register(prometheus.Collector) error
}

// Service runs beside the workers (a notifier, a reconciler).
type Service interface {
	Start(ctx context.Context) error
	Stop()
}

// Parts are what a process runs on its host.
type Parts struct {
	Handler http.Handler
	// Metrics serves GET /metrics on the metrics listener
	// (Config.MetricsAddr); unused without one.
	Metrics http.Handler
	// Workers runs the process's jobs (a client built by River, with
	// workers).
	Workers *river.Client[pgx.Tx]
	// Services start in order before the workers, and stop in reverse once
	// HTTP has drained.
	Services []Service
	// OnShutdown runs as HTTP shutdown begins, to end what would otherwise
	// hold it open (listen streams).
	OnShutdown []func()
	// Reload runs on every value from Run's reload channel (SIGHUP).
	Reload func()
	// Started adds attributes to the "started" log line.
	Started func() []any
}

// Host owns one process's listener, pool, HTTP server and workers.
type Host struct {
	cfg      Config
	listener net.Listener
	pool     *pgxpool.Pool
	// listen is a small pool on Config.ListenURL for River's listener
	// (nil without one).
	listen   *pgxpool.Pool
	parts    Parts
	server   *http.Server
	running  int // services started
	started  atomic.Bool
	stopping atomic.Bool
	serveErr chan error
	// The metrics listener and its server (Config.MetricsAddr), or nil.
	metricsLn  net.Listener
	metricsSrv *http.Server
	jobs       *telemetry.JobMetrics
	otelRiver  *otelriver.Middleware
	workers    *river.Client[pgx.Tx]
}

// New listens on cfg.Addr and opens the pool; nothing is served until Start.
func New(ctx context.Context, cfg Config) (*Host, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", cfg.Addr, err)
	}
	cfg.PublicURL = strings.TrimRight(cfg.PublicURL, "/")
	if cfg.PublicURL == "" {
		cfg.PublicURL = "http://" + ln.Addr().String()
	}
	h := &Host{cfg: cfg, listener: ln, serveErr: make(chan error, 2), jobs: telemetry.NewJobMetrics()}
	if cfg.MetricsAddr != "" {
		if h.metricsLn, err = net.Listen("tcp", cfg.MetricsAddr); err != nil {
			_ = ln.Close()
			return nil, fmt.Errorf("listen on %s (metrics): %w", cfg.MetricsAddr, err)
		}
	}
	if err := h.open(ctx); err != nil {
		h.closeListeners()
		return nil, err
	}
	// The durability it runs with, once (a warning when a failover could
	// lose an execution claim); a read-only database is refused: its
	// workers could not start (River's LISTEN) and nothing could be written.
	report, err := durability.Check(ctx, h.pool)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	if report.ReadOnly {
		h.Close()
		return nil, fmt.Errorf("the database is read-only: %s (%s)", report.Summary(), readOnlyAdvice)
	}
	durability.Log(ctx, cfg.Log, report)
	// The trace context travels in job metadata: a job's span links to the
	// span that queued it (a job may run much later, or after a restart).
	h.otelRiver = otelriver.NewMiddleware(&otelriver.MiddlewareConfig{
		TracerProvider: telemetry.QuietJobs(telemetry.Provider(cfg.TracerProvider), cfg.QuietJobs...), EnableTracePropagation: true, EnableWorkSpanJobKindSuffix: true,
	})
	if cfg.Metrics != nil {
		for _, c := range []prometheus.Collector{telemetry.PoolCollector(cfg.Key, h.pool), h.jobs} {
			if err := cfg.Metrics.Register(c); err != nil && !errors.As(err, &prometheus.AlreadyRegisteredError{}) {
				h.Close()
				return nil, fmt.Errorf("metrics: %w", err)
			}
		}
	}
	return h, nil
}

// open opens the pool, migrating first if asked: through ListenURL when
// there is one (the migrations hold a session advisory lock), and the
// small pool of River's listener on it.
func (h *Host) open(ctx context.Context) error {
	cfg := h.cfg
	wrap := func(err error) error {
		if dbdown.ReadOnly(err) {
			return fmt.Errorf("%w (%s)", err, readOnlyAdvice)
		}
		return err
	}
	dbURL := cfg.DatabaseURL
	if cfg.ListenURL != "" {
		listenCfg, err := pgxpool.ParseConfig(cfg.ListenURL)
		if err != nil {
			return fmt.Errorf("listen database URL: %w", err)
		}
		if cfg.Migrate {
			direct, err := migrations.Open(ctx, cfg.ListenURL, true, cfg.Log)
			if err != nil {
				return wrap(err)
			}
			direct.Close()
			cfg.Migrate = false
		}
		if dbURL, err = pooled(dbURL); err != nil {
			return err
		}
		listenCfg.MaxConns = 2
		listenCfg.MinConns = 0
		if h.listen, err = pgxpool.NewWithConfig(ctx, listenCfg); err != nil {
			return fmt.Errorf("connect (listen database URL): %w", err)
		}
	}
	var err error
	if h.pool, err = migrations.Open(ctx, dbURL, cfg.Migrate, cfg.Log); err != nil {
		if h.listen != nil {
			h.listen.Close()
		}
		return wrap(err)
	}
	if h.listen != nil {
		pglisten.Direct(h.pool, h.listen.Config().ConnConfig)
	}
	return nil
}

// pooled is databaseURL for a pool behind a transaction-mode pooler: with
// default_query_exec_mode=cache_describe (statements described once and
// cached by pgx, each then sent unnamed and parsed where it runs, so that
// no named prepared statement is left on a server connection the pooler
// hands to another client next; parameters keep their types, which exec
// mode would lose) unless it names a mode itself.
func pooled(databaseURL string) (string, error) {
	if strings.Contains(databaseURL, "default_query_exec_mode") {
		return databaseURL, nil
	}
	if u, err := url.Parse(databaseURL); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set("default_query_exec_mode", "cache_describe")
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	if strings.Contains(databaseURL, "://") {
		return "", errors.New("database URL: not a postgres:// URL")
	}
	return databaseURL + " default_query_exec_mode=cache_describe", nil // keyword/value
}

// riverDriver is River's pgx driver on the pool, whose listener (River's
// LISTEN) connects through the listen pool instead: a pooler in
// transaction mode would hand its session to others.
type riverDriver struct {
	*riverpgxv5.Driver
	listen *riverpgxv5.Driver
}

func (d riverDriver) GetListener(params *riverdriver.GetListenenerParams) riverdriver.Listener {
	return d.listen.GetListener(params)
}

func (h *Host) closeListeners() {
	_ = h.listener.Close()
	if h.metricsLn != nil {
		_ = h.metricsLn.Close()
	}
}

// River returns a client on the pool, logging only warnings and errors. A
// client without workers inserts jobs, so services can be built before the
// worker client that needs them.
func (h *Host) River(cfg *river.Config) (*river.Client[pgx.Tx], error) {
	if cfg.Logger == nil {
		cfg.Logger = logs.Quiet(h.cfg.Log, slog.LevelWarn)
	}
	cfg.Plugins = append(cfg.Plugins, h.otelRiver)
	if cfg.Workers != nil {
		cfg.Middleware = append(cfg.Middleware, rivertype.Middleware(h.jobs))
	}
	var driver riverdriver.Driver[pgx.Tx] = riverpgxv5.New(h.pool)
	if h.listen != nil {
		driver = riverDriver{Driver: riverpgxv5.New(h.pool), listen: riverpgxv5.New(h.listen)}
	}
	c, err := river.NewClient(driver, cfg)
	if err != nil {
		return nil, fmt.Errorf("river: %w", err)
	}
	return c, nil
}

// Mount sets what Start runs.
func (h *Host) Mount(p Parts) {
	h.parts = p
	h.workers = p.Workers
	if h.metricsLn != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", p.Metrics)
		h.metricsSrv = httpServer(mux)
	}
	h.server = httpServer(telemetry.Handler(p.Handler, h.cfg.TracerProvider))
	for _, f := range p.OnShutdown {
		h.server.RegisterOnShutdown(f)
	}
}

// Close releases the listener and the pool of a host that never started
// (its process failed to build).
func (h *Host) Close() {
	h.closeListeners()
	h.closePools()
}

func (h *Host) closePools() {
	pglisten.Forget(h.pool)
	h.pool.Close()
	if h.listen != nil {
		h.listen.Close()
	}
}

// Start runs the services and the workers, then serves. If any fails to
// start, what did start is stopped again.
func (h *Host) Start(ctx context.Context) error {
	if h.server == nil {
		return errors.New("start: nothing mounted")
	}
	for _, s := range h.parts.Services {
		if err := s.Start(ctx); err != nil {
			h.stopServices()
			return fmt.Errorf("start: %w", err)
		}
		h.running++
	}
	if err := h.parts.Workers.Start(ctx); err != nil {
		h.stopServices()
		return fmt.Errorf("start workers: %w", err)
	}
	go func() { h.serveErr <- h.server.Serve(h.listener) }()
	if h.metricsSrv != nil {
		go func() { h.serveErr <- h.metricsSrv.Serve(h.metricsLn) }()
	}
	h.started.Store(true)
	attrs := []any{"addr", h.Addr(), "public_url", h.URL()}
	if h.metricsLn != nil {
		attrs = append(attrs, "metrics_addr", h.MetricsAddr())
	}
	if h.parts.Started != nil {
		attrs = append(attrs, h.parts.Started()...)
	}
	h.cfg.Log.Info(h.cfg.Name+" started", attrs...)
	return nil
}

// Stop drains HTTP, stops the services in reverse, then the workers, and
// closes the pool.
func (h *Host) Stop(ctx context.Context) error {
	h.stopping.Store(true)
	var errs []error
	if !h.started.Load() {
		// Shutdown closes only the listeners Serve was given.
		h.closeListeners()
	}
	if h.server != nil {
		if err := h.server.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("http shutdown: %w", err))
		}
	}
	if h.metricsSrv != nil && h.started.Load() {
		if err := h.metricsSrv.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("metrics shutdown: %w", err))
		}
	}
	h.stopServices()
	if h.started.Load() {
		if err := h.parts.Workers.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop workers: %w", err))
		}
	}
	h.closePools()
	h.cfg.Log.Info(h.cfg.Name + " stopped")
	return errors.Join(errs...)
}

func (h *Host) stopServices() {
	for ; h.running > 0; h.running-- {
		h.parts.Services[h.running-1].Stop()
	}
}

// Run starts the host and serves until ctx ends (SIGTERM), calling the
// Reload part on every value from reload (SIGHUP; nil for none). It then
// stops, giving work in flight up to 30 seconds.
func (h *Host) Run(ctx context.Context, reload <-chan struct{}) error {
	stop := func() error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		return h.Stop(ctx)
	}
	if err := h.Start(ctx); err != nil {
		if ctx.Err() != nil {
			// Stopped before it had started: a clean stop, not a failure.
			h.cfg.Log.Info("stopped while starting")
			return stop()
		}
		return errors.Join(err, stop())
	}
	var serveErr error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-reload:
			if h.parts.Reload != nil {
				h.parts.Reload()
			}
		case err := <-h.serveErr:
			if !errors.Is(err, http.ErrServerClosed) {
				serveErr = fmt.Errorf("serve: %w", err)
			}
			break loop
		}
	}
	h.cfg.Log.Info("shutting down")
	return errors.Join(serveErr, stop())
}

// readOnlyAdvice follows every "the database is read-only" of a host.
const readOnlyAdvice = "a standby, or transaction_read_only is on: point the database URL at the primary, e.g. a multi-host URL with target_session_attrs=read-write"

// ErrDatabase marks Ready's error when the database does not answer, or
// answers read-only (dbdown.ErrReadOnly too), as opposed to a process
// starting or stopping.
var ErrDatabase = errors.New("database")

// Ready reports whether the process can take traffic: started, not
// stopping, and its database answering and writable.
func (h *Host) Ready(ctx context.Context) error {
	_, err := h.Probe(ctx)
	return err
}

// Probe is Ready with the durability report of the database (nil when it
// was not asked or did not answer). A read-only database (a standby in
// recovery, as a stale DNS name or a pooler pointing at a former primary
// gives after a failover) is not ready, and the pool's connections are
// dropped, so that new ones look up the address again; a durability
// warning is not an outage.
func (h *Host) Probe(ctx context.Context) (*durability.Report, error) {
	if h.stopping.Load() {
		return nil, errors.New("shutting down")
	}
	if !h.started.Load() {
		return nil, errors.New("starting")
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	report, err := durability.Check(ctx, h.pool)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDatabase, err)
	}
	if report.ReadOnly {
		h.pool.Reset()
		return &report, fmt.Errorf("%w: %w: %s", ErrDatabase, dbdown.ErrReadOnly, report.Summary())
	}
	return &report, nil
}

// URL is the public base URL, without a trailing slash.
func (h *Host) URL() string { return h.cfg.PublicURL }

// Addr is the address the host listens on.
func (h *Host) Addr() string { return h.listener.Addr().String() }

// MetricsAddr is the address of the metrics listener, "" without one.
func (h *Host) MetricsAddr() string {
	if h.metricsLn == nil {
		return ""
	}
	return h.metricsLn.Addr().String()
}

// Leader reports whether this process's workers hold River's leadership
// now (false before they start, or when the database cannot say). One
// replica at a time does: a gauge of a database-wide count reported only
// by it is counted once across replicas.
func (h *Host) Leader(ctx context.Context) bool {
	if h.workers == nil || !h.started.Load() {
		return false
	}
	var leader bool
	err := h.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+pgx.Identifier{h.workers.Schema(), "river_leader"}.Sanitize()+`
		WHERE leader_id = $1 AND expires_at > now())`, h.workers.ID()).Scan(&leader)
	return err == nil && leader
}

// Pool is the database pool.
func (h *Host) Pool() *pgxpool.Pool { return h.pool }

// httpServer wraps handler with the timeouts every listener should have.
func httpServer(handler http.Handler) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    32 << 10,
	}
}
