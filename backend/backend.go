// Package backend assembles the approval backend (`arapd serve`): signing
// keys, policy engine, request service, callbacks, River workers and the
// HTTP surface, on an internal/host that owns the listener, pool and
// lifecycle. It holds no logic of its own; everything it wires is tested in
// its own package.
package backend

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/riverqueue/river"
	"go.opentelemetry.io/otel/trace"

	"github.com/omcp/arap/arap"
	"github.com/omcp/arap/attributes"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/callbacks"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/directory"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/internal/announce"
	"github.com/omcp/arap/internal/host"
	"github.com/omcp/arap/internal/ratelimit"
	"github.com/omcp/arap/internal/seal"
	"github.com/omcp/arap/internal/version"
	"github.com/omcp/arap/migrations"
	"github.com/omcp/arap/notify"
	"github.com/omcp/arap/passkeys"
	"github.com/omcp/arap/requests"
	"github.com/omcp/arap/signing"
	"github.com/omcp/arap/slackapp"
	"github.com/omcp/arap/sso"
	"github.com/omcp/arap/webui"
)

// fetchCooldown is River's one setting for two things: the least time
// between the workers' fetches of a queue, and between a client's
// notifications of new jobs in a queue. A job inserted within it of the last
// notified one waits for the next poll (FetchPollInterval), so both clients
// below take it (docs/performance.md, "approve-to-complete").
const fetchCooldown = 10 * time.Millisecond

// Config configures the backend.
type Config struct {
	// Addr is the listen address, e.g. "127.0.0.1:8480" (":0" picks a port).
	Addr string
	// PublicURL is the base URL clients use; derived from Addr when empty.
	PublicURL   string
	DatabaseURL string
	// ListenURL, when set, is a direct connection to PostgreSQL for LISTEN
	// and migrations, DatabaseURL then going through a transaction-mode
	// pooler (host.Config.ListenURL, --database-listen-url).
	ListenURL  string
	PolicyFile string
	// MasterKey (32 bytes) seals signing keys in the database.
	MasterKey []byte
	// PreviousMasterKeys (32 bytes each) open values sealed before a master-key
	// rotation; they never seal.
	PreviousMasterKeys [][]byte
	// Migrate applies pending migrations at start.
	Migrate bool
	// Workers is the number of concurrent River jobs; default 20.
	Workers int
	Limits  arap.Limits
	Log     *slog.Logger
	// TrustedProxies are the reverse proxies whose X-Forwarded-For names
	// the client (--trusted-proxies).
	TrustedProxies []netip.Prefix
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
	// Mail, if set, turns on e-mail notifications through this SMTP
	// server; without it nobody is notified.
	Mail *notify.EmailConfig
	// Slack, if set (with a token), turns on the Slack app: direct messages
	// to deciders and the interactivity endpoint of their buttons.
	Slack *slackapp.Config
	// OIDC, if set, lets approvers sign in to the web UI through this
	// OpenID provider; its RedirectURL is derived from the public URL
	// (<public-url>/ui/oidc/callback). The provider is discovered at start:
	// a misconfigured one stops the backend from starting.
	OIDC *sso.Config
	// NoLocalPasswords turns password sign-in to the web UI off (OIDC is
	// then required).
	NoLocalPasswords bool
	// DevMail, `arapd dev` only, serves the dev mail sink at /dev/mail.
	DevMail http.Handler
	// RateLimitClock, if set, is the rate limits' clock (tests pin it, so
	// that no window ends in the middle of a test).
	RateLimitClock func() time.Time
	// issue21-obs
	// MetricsAddr, if set, serves /metrics there only (not on Addr).
	MetricsAddr string
	// TracerProvider traces requests, jobs and callbacks; the global
	// provider (set up from OTEL_* by telemetry.FromEnv) when nil.
	TracerProvider trace.TracerProvider
	// DecisionMaxAge bounds how long a front-end may reuse an allowed
	// decision the PDP marks cacheable (evaluation.CacheOptions); default
	// DefaultDecisionMaxAge, negative: no decision is marked.
	DecisionMaxAge time.Duration
}

// DefaultDecisionMaxAge is the default of Config.DecisionMaxAge.
const DefaultDecisionMaxAge = time.Minute

// Backend is a running (or ready to run) backend.
type Backend struct {
	cfg       Config
	engine    *evaluation.Engine
	requests  *requests.Service
	keys      *signing.Keys
	clients   *clients.Store
	people    *directory.Store
	attrs     *attributes.Store
	changes   *announce.Hub // the change stream's listener
	callbacks *callbacks.Service
	notify    *notify.Service
	host      *host.Host
	reg       *prometheus.Registry
	metrics   http.Handler // the default registry's metrics and reg's
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
		return nil, errors.New("backend: a database URL is required (ARAP_DATABASE_URL or DATABASE_URL, or a file named by --database-url-file)")
	}
	if cfg.PolicyFile == "" {
		return nil, errors.New("backend: a policy file is required (--policy)")
	}
	if public := strings.TrimRight(cfg.PublicURL, "/"); public != "" {
		if u, err := url.Parse(public); err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
			return nil, fmt.Errorf("backend: public URL %q must be an absolute http(s) URL", cfg.PublicURL)
		}
	}
	// This backend's own metrics (its pool, jobs and gauges) on a registry
	// of its own, served with the process-wide ones (HTTP, decisions) of
	// the default registry: several backends in one process (tests) each
	// show their own.
	reg := prometheus.NewRegistry()
	h, err := host.New(ctx, host.Config{Name: "backend", Addr: cfg.Addr, PublicURL: cfg.PublicURL, DatabaseURL: cfg.DatabaseURL, ListenURL: cfg.ListenURL, Migrate: cfg.Migrate, Log: cfg.Log,
		Key: "backend", Metrics: reg, MetricsAddr: cfg.MetricsAddr, TracerProvider: cfg.TracerProvider,
		QuietJobs: []string{requests.ExpireDueArgs{}.Kind(), requests.RemindDueArgs{}.Kind()}})
	if err != nil {
		return nil, fmt.Errorf("backend: %w", err)
	}
	b := &Backend{cfg: cfg, host: h, reg: reg,
		metrics: promhttp.HandlerFor(prometheus.Gatherers{prometheus.DefaultGatherer, reg}, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})}
	if err := b.build(ctx); err != nil {
		h.Close()
		return nil, err
	}
	return b, nil
}

func (b *Backend) build(ctx context.Context) error {
	cfg := b.cfg
	public := b.host.URL()
	if !strings.HasPrefix(public, "https://") && !isLoopback(public) {
		cfg.Log.Warn("public URL is not https; ARAP requires HTTPS endpoints outside local development", "public_url", public)
	}
	pool := b.host.Pool()
	var err error
	if b.keys, err = signing.Open(ctx, pool, signing.Options{MasterKey: cfg.MasterKey, PreviousMasterKeys: cfg.PreviousMasterKeys}); err != nil {
		return err
	}
	requestsURL := public + authzen.PathRequests
	b.attrs = attributes.NewStore(pool)
	b.attrs.Log = cfg.Log
	b.people = directory.NewStore(pool)
	// What the front-ends' decision caches hear of (package announce): a
	// decision computed within Settle of a change may have read the
	// attributes as they were before it.
	b.changes = &announce.Hub{DB: pool, Log: cfg.Log, Settle: b.attrs.MaxStaleness() + 500*time.Millisecond}
	maxAge := cmp.Or(cfg.DecisionMaxAge, DefaultDecisionMaxAge)
	if maxAge < 0 {
		maxAge = 0
	}
	if b.engine, err = evaluation.New(evaluation.Options{
		PolicyFile: cfg.PolicyFile, Keys: b.keys, Issuer: public, RequestsURL: requestsURL,
		SchemaURL:  func(tpl string) string { return public + authzen.PathSchemas + "/" + url.PathEscape(tpl) },
		Attributes: b.attrs,
		// The directory's users and groups, for policies that say
		// subject_attributes: {source: directory}.
		SubjectSources: map[string]evaluation.SubjectSource{"directory": attributes.Directory{People: b.people}},
		Approvals:      &requests.ApprovalStore{DB: pool, Now: time.Now},
		// Attributes.Set, the directory's changes and every reload are
		// announced; the time never is.
		Cache: evaluation.CacheOptions{MaxAge: maxAge, Attributes: true, Sources: []string{"directory"}},
		Log:   cfg.Log,
	}); err != nil {
		return err
	}
	// Jobs are inserted through a client without workers, so the services can
	// be built before the worker client that needs them. Its FetchCooldown is
	// also how often it may notify the workers of an insert: at River's
	// default (100 ms) most callback deliveries waited for the next poll.
	inserter, err := b.host.River(&river.Config{Schema: migrations.RiverSchema, FetchCooldown: fetchCooldown})
	if err != nil {
		return fmt.Errorf("backend: %w", err)
	}
	statusEndpoint := func(id string) string { return requestsURL + "/" + id }
	if b.callbacks, err = callbacks.NewService(callbacks.Config{
		DB: pool, Jobs: inserter, MasterKey: cfg.MasterKey, PreviousMasterKeys: cfg.PreviousMasterKeys, StatusEndpoint: statusEndpoint,
		Schedule: cfg.CallbackSchedule, Log: cfg.Log, TracerProvider: cfg.TracerProvider,
	}); err != nil {
		return err
	}
	if err := b.reg.Register(b.callbacks.QueueDepth(b.host.Leader)); err != nil {
		return err
	}
	// Webhook targets are always available (they are configured in the
	// database, like callbacks' clients); e-mail when an SMTP server is.
	channels := []notify.Channel{&notify.Webhook{Poster: b.callbacks}}
	if cfg.Mail != nil {
		email, err := notify.NewEmail(*cfg.Mail)
		if err != nil {
			return fmt.Errorf("backend: %w", err)
		}
		channels = append(channels, email)
	}
	if cfg.Slack != nil {
		sl, err := slackapp.NewChannel(*cfg.Slack)
		if err != nil {
			return fmt.Errorf("backend: %w", err)
		}
		channels = append(channels, sl)
	}
	if b.notify, err = notify.NewService(notify.Config{
		DB: pool, Jobs: inserter, Directory: b.people, Channels: channels,
		// requests is built next, with notify as its Events.
		Requests: lateRequests{b},
		PageURL:  func(id string) string { return public + "/ui/requests/" + url.PathEscape(id) },
		Log:      cfg.Log,
	}); err != nil {
		return err
	}
	// Passkeys need the UI at a domain name (the WebAuthn relying party id
	// is the public URL's host); without one, rules requiring a signed
	// decision cannot be decided, and the UI says why.
	var signer requests.PasskeyVerifier
	keysOfPeople, passkeysOff := passkeys.New(passkeys.Config{DB: pool, PublicURL: public, Now: cfg.Now})
	if passkeysOff != nil {
		cfg.Log.Warn("passkeys unavailable: rules with approval.require_passkey cannot be decided", "error", passkeysOff)
	} else {
		signer = keysOfPeople
	}
	if b.requests, err = requests.NewService(requests.Config{
		DB: pool, Jobs: inserter, Keys: b.keys, Policy: b.engine, Issuer: public, RequestsURL: requestsURL,
		Retention: cfg.RequestRetention, Log: cfg.Log,
		CheckCallback: b.callbacks.CheckCallback, OnTerminal: b.callbacks.OnTerminal, Events: b.notify,
		Passkeys: signer, People: b.people,
	}); err != nil {
		return err
	}
	if err := b.reg.Register(policyReloads); err != nil {
		return err
	}
	if err := b.reg.Register(b.requests.PendingGauge(b.host.Leader)); err != nil {
		return err
	}
	if err := prometheus.Register(version.Collector()); err != nil && !errors.As(err, &prometheus.AlreadyRegisteredError{}) {
		return err
	}
	b.clients = clients.NewStore(pool)
	counters := ratelimit.NewCounters(pool, pgx.Identifier{"arap", "rate_counters"})
	counters.Now = cfg.RateLimitClock

	workers := river.NewWorkers()
	b.requests.AddWorkers(workers)
	b.callbacks.AddWorkers(workers)
	b.notify.AddWorkers(workers)
	counters.AddWorker(workers)
	jobs, err := b.host.River(&river.Config{
		Schema:  migrations.RiverSchema,
		Workers: workers,
		Queues: map[string]river.QueueConfig{
			river.QueueDefault:        {MaxWorkers: cfg.Workers},
			requests.QueueMaintenance: {MaxWorkers: requests.MaintenanceWorkers},
			notify.Queue:              {MaxWorkers: notify.Workers},
		},
		PeriodicJobs: append(b.requests.PeriodicJobs(), counters.PeriodicJob(&river.InsertOpts{Queue: requests.QueueMaintenance})),
		JobTimeout:   cfg.JobTimeout,
		// A callback delivery is a job, so its pickup delay is every PEP's
		// approve-to-complete latency; River's default 1 s poll is too slow
		// for that (docs/performance.md, "approve-to-complete").
		FetchPollInterval: 50 * time.Millisecond,
		FetchCooldown:     fetchCooldown,
		// A job whose worker died (kill -9) is retried after this.
		RescueStuckJobsAfter: 2 * cfg.JobTimeout,
	})
	if err != nil {
		return fmt.Errorf("backend: %w", err)
	}

	origin, _ := url.Parse(public)
	var rp *sso.RP
	if cfg.OIDC != nil {
		c := *cfg.OIDC
		c.RedirectURL = public + "/ui/oidc/callback"
		if rp, err = sso.New(ctx, c); err != nil {
			return fmt.Errorf("backend: %w", err)
		}
	}
	uiDeps := webui.Deps{
		DB: pool, Requests: b.requests, Directory: b.people, Counters: counters, Clients: b.clients,
		SSO: rp, DisablePasswords: cfg.NoLocalPasswords,
		Secure: origin.Scheme == "https", Now: cfg.Now, Log: cfg.Log,
	}
	if passkeysOff != nil {
		uiDeps.PasskeysUnavailable = passkeysOff.Error()
	} else {
		uiDeps.Passkeys = keysOfPeople
	}
	ui, err := webui.New(uiDeps)
	if err != nil {
		return err
	}
	served := b.metrics
	if cfg.MetricsAddr != "" {
		served = nil // on the metrics listener only
	}
	var slackApp arap.SlackApp
	if cfg.Slack != nil {
		if slackApp, err = slackapp.NewApp(*cfg.Slack, pool, b.requests, b.people, cfg.Log); err != nil {
			return fmt.Errorf("backend: %w", err)
		}
	}
	h, err := arap.New(arap.Deps{
		PublicURL: public, Clients: b.clients, Engine: b.engine, Requests: b.requests, Keys: b.keys, Callbacks: b.callbacks,
		Counters: counters, Limits: cfg.Limits, Log: cfg.Log, Ready: b.host.Probe, UI: ui, People: b.people, DevMail: cfg.DevMail, Audit: pool,
		Slack: slackApp, TrustedProxies: cfg.TrustedProxies, Metrics: served, ReloadPolicy: b.reloadEverywhere, Changes: b.changes,
	})
	if err != nil {
		return err
	}
	b.host.Mount(host.Parts{
		Handler: h, Metrics: b.metrics, Workers: jobs, Reload: func() { _ = b.Reload() },
		Services: []host.Service{&notify.Dispatcher{Service: b.notify}, b.attrs, &policyHearer{b: b}, b.changes},
		// A change stream never ends by itself.
		OnShutdown: []func(){b.changes.End},
		Started: func() []any {
			// The master key's id (which says nothing about the key) shows
			// which key each replica seals under during a rotation.
			return []any{"policy", cfg.PolicyFile, "rules", len(b.engine.Policy().Rules), "signing_key", b.keys.ActiveKid(),
				"master_key_id", seal.KeyID(cfg.MasterKey)}
		},
	})
	return nil
}

// lateRequests is notify.Requests for the requests service built after it
// (requests takes notify as its Events).
type lateRequests struct{ b *Backend }

func (l lateRequests) Load(ctx context.Context, id string) (*requests.Request, error) {
	return l.b.requests.Load(ctx, id)
}

func (l lateRequests) Votes(ctx context.Context, id string) ([]requests.Vote, error) {
	return l.b.requests.Votes(ctx, id)
}

func isLoopback(u string) bool {
	p, err := url.Parse(u)
	if err != nil {
		return false
	}
	name := p.Hostname()
	ip := net.ParseIP(name)
	return name == "localhost" || (ip != nil && ip.IsLoopback())
}

// Start runs the job workers and begins serving HTTP.
func (b *Backend) Start(ctx context.Context) error {
	if err := b.host.Start(ctx); err != nil {
		return fmt.Errorf("backend: %w", err)
	}
	return nil
}

// Stop drains HTTP (in-flight requests finish, new connections are
// refused), then stops the workers (running jobs finish or are abandoned to
// be rescued by another replica), then closes the pool.
func (b *Backend) Stop(ctx context.Context) error { return b.host.Stop(ctx) }

// MetricsAddr is the address of the metrics listener (Config.MetricsAddr),
// "" without one.
func (b *Backend) MetricsAddr() string { return b.host.MetricsAddr() }

// URL is the backend's public base URL.
func (b *Backend) URL() string { return b.host.URL() }

// Addr is the address the backend listens on.
func (b *Backend) Addr() string { return b.host.Addr() }

// Pool is the backend's database pool (for dev-mode seeding and tests).
func (b *Backend) Pool() *pgxpool.Pool { return b.host.Pool() }

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

// Changes is the listener feeding the decision change stream.
func (b *Backend) Changes() *announce.Hub { return b.changes }

// Engine is the policy decision point.
func (b *Backend) Engine() *evaluation.Engine { return b.engine }

// Run starts the backend and serves until ctx ends (SIGTERM), reloading the
// policy on every value from reload (SIGHUP). It then stops gracefully,
// giving in-flight work up to 30 seconds.
func (b *Backend) Run(ctx context.Context, reload <-chan struct{}) error {
	if err := b.host.Run(ctx, reload); err != nil {
		return fmt.Errorf("backend: %w", err)
	}
	return nil
}
