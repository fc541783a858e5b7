// Command arapd runs the approval backend.
//
//	arapd serve     the backend (AuthZEN PDP, ARAP Access Request Service, workers)
//	arapd mcp       the MCP front-end (policy enforcement point)
//	arapd dev       everything on loopback with a private PostgreSQL and seed data
//	arapd migrate   apply database migrations (ours and River's)
package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	_ "net/http/pprof"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/agentauth"
	"github.com/omcp/arap/arap"
	"github.com/omcp/arap/backend"
	"github.com/omcp/arap/frontend"
	"github.com/omcp/arap/internal/clientip"
	"github.com/omcp/arap/internal/config"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/internal/seal"
	"github.com/omcp/arap/internal/telemetry"
	"github.com/omcp/arap/internal/version"
	"github.com/omcp/arap/mcp/fixtures"
	"github.com/omcp/arap/migrations"
	"github.com/omcp/arap/notify"
	"github.com/omcp/arap/pep"
	"github.com/omcp/arap/slackapp"
	"github.com/omcp/arap/sso"
)

const usage = `usage: arapd <command> [flags]

commands:
  serve     run the backend (AuthZEN PDP, ARAP Access Request Service, workers)
  mcp       run the MCP front-end (the policy enforcement point)
  dev       run everything locally with a private PostgreSQL and seed data
  migrate   apply database migrations

Run "arapd <command> -h" for the flags of a command, "arapd --version" for
the build.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	if addr := os.Getenv("ARAP_PPROF_ADDR"); addr != "" {
		// Profiling on its own listener (net/http/pprof registers on the
		// default mux, which no server here uses otherwise). Loopback only.
		if host, _, err := net.SplitHostPort(addr); err != nil || !net.ParseIP(host).IsLoopback() {
			fmt.Fprintln(os.Stderr, "arapd: ARAP_PPROF_ADDR must be a loopback host:port")
			os.Exit(2)
		}
		go func() { fmt.Fprintln(os.Stderr, "arapd: pprof:", http.ListenAndServe(addr, nil)) }()
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "mcp":
		err = runMCP(os.Args[2:])
	case "dev":
		err = runDev(os.Args[2:])
	case "migrate":
		err = migrate(os.Args[2:])
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	case "--version", "-version", "version":
		fmt.Println(version.Get().String("arapd"))
		return
	default:
		fmt.Fprintf(os.Stderr, "arapd: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if errors.Is(err, config.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "arapd:", err)
		os.Exit(1)
	}
}

// logger writes JSON lines at level to standard error.
func logger(level slog.Level) *slog.Logger {
	// Records logged with a traced context carry its trace and span ids.
	return slog.New(telemetry.LogHandler(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
}

// tracing sets up the global tracer provider from the standard OTEL_*
// variables (nothing is exported unless they say where); the returned
// function flushes what is left at exit.
func tracing(service string) (func(), error) {
	_, shutdown, err := telemetry.FromEnv(context.Background(), service)
	if err != nil {
		return nil, err
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = shutdown(ctx)
	}, nil
}

func metricsAddr(c *config.Set) *string {
	return c.String("metrics-addr", "", "serve /metrics on this address only, not on --addr (default: on --addr)")
}

// The settings more than one command has.

func databaseURL(c *config.Set) *config.Secret {
	return c.Secret("database-url", "the PostgreSQL URL (it may hold a password)", "ARAP_DATABASE_URL", "DATABASE_URL")
}

func listenURL(c *config.Set) *config.Secret {
	return c.Secret("database-listen-url", "a direct PostgreSQL URL, not through a pooler, for LISTEN and migrations: set it when DATABASE_URL goes through PgBouncer in transaction mode (docs/reliability.md, Connection poolers)", "ARAP_DATABASE_LISTEN_URL")
}

func logLevel(c *config.Set) *slog.Level {
	l := new(slog.Level)
	c.TextVar(l, "log-level", slog.LevelInfo, "debug, info, warn or error")
	return l
}

func trustedProxies(c *config.Set) *string {
	return c.String("trusted-proxies", "", "comma-separated addresses or CIDR prefixes of reverse proxies whose X-Forwarded-For names the client (default none: the connection's peer is the client)")
}

// signals returns a context cancelled by SIGTERM or SIGINT and a channel fed
// by SIGHUP.
func signals() (context.Context, <-chan struct{}) {
	ctx, _ := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	reload := make(chan struct{}, 1)
	go func() {
		for range hup {
			select {
			case reload <- struct{}{}:
			default:
			}
		}
	}()
	return ctx, reload
}

func serve(args []string) error {
	c := config.New("arapd serve", os.Stdout)
	addr := c.String("addr", "127.0.0.1:8480", "listen address")
	public := c.String("public-url", "", "external base URL, e.g. https://arap.example.com (default http://<addr>)")
	dbURL := databaseURL(c)
	listen := listenURL(c)
	policy := c.String("policy", "", "policy file; reloaded on SIGHUP")
	key := c.Secret("master-key", "the master key, base64 of 32 random bytes (openssl rand -base64 32)")
	doMigrate := c.Bool("migrate", false, "apply pending migrations before starting")
	jobTimeout := c.Duration("job-timeout", time.Minute, "bound on a background job; a job whose worker died is retried after twice this")
	rate := c.Int("rate-limit", arap.DefaultLimits.RequestsPerMinute, "requests per minute each API client may make (all replicas together)")
	level := logLevel(c)
	trusted := trustedProxies(c)
	metrics := metricsAddr(c)
	smtpURL := c.String("smtp-url", "", "SMTP server for e-mail notifications: smtp://host[:port] (STARTTLS), smtps://host[:port] (TLS); e-mail is off without it")
	smtpUser := c.String("smtp-username", "", "SMTP user name")
	smtpPassword := c.Secret("smtp-password", "the SMTP password")
	mailFrom := c.String("mail-from", "", "sender address of notifications")
	slackToken := c.Secret("slack-token", "the Slack bot token (Slack is off without it)")
	slackSecret := c.Secret("slack-signing-secret", "the Slack app's signing secret (without it the Approve and Deny buttons are refused)")
	slackAPI := c.String("slack-api-url", "", "Slack Web API base URL, for tests (default https://slack.com/api/)")
	oidcIssuer := c.String("oidc-issuer", "", "OpenID provider's issuer URL for approver sign-in to the web UI (off without it); the redirect URL to register is <public-url>/ui/oidc/callback")
	oidcClient := c.String("oidc-client-id", "", "client id at the OpenID provider")
	oidcSecret := c.Secret("oidc-client-secret", "the OpenID client secret")
	oidcGroups := c.String("oidc-groups-claim", "", "ID token claim listing the user's groups; its values naming directory groups become the user's memberships at every sign-in (off without it)")
	oidcScopes := c.String("oidc-scopes", "openid email profile", "scopes requested, space-separated")
	oidcName := c.String("oidc-name", "", "the provider's name on the sign-in button")
	localPasswords := c.Bool("local-passwords", true, "allow sign-in to the web UI with local passwords; false needs --oidc-issuer")
	prevKeys := c.Secret("master-key-previous", "earlier master keys (base64, comma or newline separated) that still open values sealed before a rotation, never seal")
	if err := c.Parse(args); err != nil {
		return err
	}
	log := logger(*level)
	flush, err := tracing("arapd-serve")
	if err != nil {
		return err
	}
	defer flush()
	masterKey, err := decodeMasterKey(key)
	if err != nil {
		return err
	}
	previous, err := previousKeys(prevKeys)
	if err != nil {
		return err
	}
	proxies, err := clientip.ParsePrefixes(*trusted)
	if err != nil {
		return fmt.Errorf("--trusted-proxies: %w", err)
	}
	mail, err := mailConfig(*smtpURL, *smtpUser, smtpPassword.Value(), *mailFrom)
	if err != nil {
		return err
	}
	slackConf, err := slackConfig(slackToken.Value(), slackSecret.Value(), *slackAPI)
	if err != nil {
		return err
	}
	oidcConf, err := oidcConfig(*oidcIssuer, *oidcClient, oidcSecret.Value(), *oidcGroups, *oidcScopes, *oidcName)
	if err != nil {
		return err
	}
	ctx, reload := signals()
	b, err := backend.New(ctx, backend.Config{
		Addr: *addr, PublicURL: *public, DatabaseURL: dbURL.Value(), ListenURL: listen.Value(), PolicyFile: *policy, MasterKey: masterKey, PreviousMasterKeys: previous, Migrate: *doMigrate, Log: log,
		JobTimeout: *jobTimeout, Limits: arap.Limits{RequestsPerMinute: *rate}, Mail: mail, Slack: slackConf,
		OIDC: oidcConf, NoLocalPasswords: !*localPasswords, TrustedProxies: proxies, MetricsAddr: *metrics,
	})
	if err != nil {
		return err
	}
	return b.Run(ctx, reload)
}

// mailConfig is the e-mail channel's configuration, or nil (e-mail off)
// without an SMTP URL.
func mailConfig(smtpURL, user, password, from string) (*notify.EmailConfig, error) {
	if smtpURL == "" {
		if user != "" || password != "" || from != "" {
			return nil, errors.New("--smtp-username, the SMTP password and --mail-from need --smtp-url (ARAP_SMTP_URL)")
		}
		return nil, nil
	}
	if password != "" && user == "" {
		return nil, errors.New("an SMTP password is set but no user name (--smtp-username, ARAP_SMTP_USERNAME)")
	}
	if user != "" && password == "" {
		return nil, errors.New("an SMTP user name is set but no password (ARAP_SMTP_PASSWORD or --smtp-password-file)")
	}
	c := &notify.EmailConfig{URL: smtpURL, Username: user, Password: password, From: from}
	if _, err := notify.NewEmail(*c); err != nil { // refuse a bad configuration at start, not at the first send
		return nil, err
	}
	return c, nil
}

// slackConfig is the Slack app's configuration, or nil (Slack off) without
// a token.
func slackConfig(token, secret, apiURL string) (*slackapp.Config, error) {
	if token == "" {
		if secret != "" || apiURL != "" {
			return nil, errors.New("a Slack signing secret or API URL is set but no token (ARAP_SLACK_TOKEN or --slack-token-file)")
		}
		return nil, nil
	}
	if apiURL != "" && !strings.HasSuffix(apiURL, "/") {
		apiURL += "/"
	}
	return &slackapp.Config{Token: token, SigningSecret: secret, APIURL: apiURL}, nil
}

// oidcConfig is the OpenID provider's configuration, or nil (sign-in with
// local passwords only) without an issuer.
func oidcConfig(issuer, clientID, secret, groupsClaim, scopes, name string) (*sso.Config, error) {
	if issuer == "" {
		if clientID != "" || secret != "" || groupsClaim != "" || name != "" {
			return nil, errors.New("--oidc-client-id, the client secret, --oidc-groups-claim and --oidc-name need --oidc-issuer (ARAP_OIDC_ISSUER)")
		}
		return nil, nil
	}
	return &sso.Config{Issuer: issuer, ClientID: clientID, ClientSecret: secret, GroupsClaim: groupsClaim, Scopes: strings.Fields(scopes), Name: name}, nil
}

// decodeMasterKey decodes a master key: base64 of exactly 32 bytes.
func decodeMasterKey(key *config.Secret) ([]byte, error) {
	if !key.IsSet() {
		return nil, fmt.Errorf("a master key is required: %s (base64 of 32 random bytes, e.g. `openssl rand -base64 32`)", key.Describe())
	}
	b, err := base64.StdEncoding.DecodeString(key.Value())
	if err != nil || len(b) != 32 {
		return nil, errors.New("the master key must be the base64 encoding of exactly 32 bytes")
	}
	return b, nil
}

// previousKeys decodes the master keys a rotation replaced (none when unset).
func previousKeys(keys *config.Secret) ([][]byte, error) {
	parsed, err := seal.ParseKeys(keys.Value())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keys.Describe(), err)
	}
	return parsed, nil
}

func migrate(args []string) error {
	c := config.New("arapd migrate", os.Stdout)
	dbURL := databaseURL(c)
	status := c.Bool("status", false, "print, per schema, the applied and pending migrations and whether this binary can run against the database; apply nothing", "ARAP_MIGRATE_STATUS")
	level := logLevel(c)
	if err := c.Parse(args); err != nil {
		return err
	}
	if !dbURL.IsSet() {
		return fmt.Errorf("a database is required: %s", dbURL.Describe())
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL.Value())
	if err != nil {
		return fmt.Errorf("database URL: %w", err)
	}
	defer pool.Close()
	if *status {
		st, err := migrations.Status(ctx, pool)
		if err != nil {
			return err
		}
		return migrations.WriteStatus(os.Stdout, st)
	}
	return migrations.Up(ctx, pool, logger(*level))
}

func runDev(args []string) error {
	c := config.New("arapd dev", os.Stdout)
	opts := dev.Options{}
	addr := c.String("addr", "127.0.0.1:8480", "backend and web UI address")
	mcpAddr := c.String("mcp-addr", "127.0.0.1:8481", "MCP endpoint address")
	dataDir := c.String("data-dir", dev.DefaultDataDir, "where the private PostgreSQL cluster, policy and keys live")
	dbURL := c.Secret("database-url", "a database to use instead of a private cluster", "ARAP_DATABASE_URL", "DATABASE_URL")
	upstreams := c.String("upstreams", "", "upstreams file: MCP servers whose tools the MCP endpoint offers behind the PDP; reloaded on SIGHUP")
	conformance := c.Bool("conformance-fixtures", false, "also serve the official MCP conformance suite's fixture tools on the MCP endpoint, and let requests without a token in as an anonymous caller (conformance testing only)")
	level := logLevel(c)
	if err := c.Parse(args); err != nil {
		return err
	}
	opts.Addr, opts.MCPAddr, opts.DataDir, opts.DatabaseURL, opts.Upstreams = *addr, *mcpAddr, *dataDir, dbURL.Value(), *upstreams
	opts.Log = logger(*level)
	opts.Out = os.Stdout
	flush, err := tracing("arapd-dev")
	if err != nil {
		return err
	}
	defer flush()
	if *conformance {
		opts.Frontend = withFixtures
	}
	ctx, reload := signals()
	return dev.Run(ctx, opts, reload)
}

func runMCP(args []string) error {
	tuneGC()
	// The front-end's variables keep the names they had: --addr is
	// ARAP_MCP_ADDR and the master key ARAP_PEP_MASTER_KEY, apart from the
	// backend's ARAP_ADDR and ARAP_MASTER_KEY (one environment may hold both).
	c := config.New("arapd mcp", os.Stdout)
	addr := c.String("addr", "127.0.0.1:8481", "listen address", "ARAP_MCP_ADDR")
	public := c.String("public-url", "", "base URL the backend uses for callbacks (default http://<addr>)", "ARAP_MCP_PUBLIC_URL")
	dbURL := databaseURL(c)
	listen := listenURL(c)
	backendURL := c.String("backend-url", "http://127.0.0.1:8480", "the backend (PDP and Access Request Service) base URL")
	token := c.Secret("backend-token", "the front-end's API token at the backend (scopes evaluate and request)")
	secrets := c.Secret("webhook-secrets", "the secrets verifying the backend's callbacks, comma-separated (for rotation); none: poll only")
	upstreams := c.String("upstreams", "", "upstreams file: MCP servers whose tools are offered behind the PDP; reloaded on SIGHUP")
	key := c.Secret("master-key", "the base64 32-byte key sealing stored arguments", "ARAP_PEP_MASTER_KEY")
	prevKeys := c.Secret("master-key-previous", "earlier keys (base64, comma or newline separated) that still open values sealed before a rotation, never seal", "ARAP_PEP_MASTER_KEY_PREVIOUS")
	execTimeout := c.Duration("exec-timeout", 30*time.Second, "bound on one tool run and the writing of its outcome (the run gets all but a fifth, at most 5s); a claimed run not recorded by then ends outcome-unknown")
	maxWindow := c.Duration("max-window", 7*24*time.Hour, "longest a task waits for a decision, whatever the backend allows; then it ends denied")
	poll := c.Duration("poll-interval", 2*time.Second, "pollIntervalMs suggested to clients and the first backend poll delay")
	reconcile := c.Duration("reconcile-every", 10*time.Second, "how often crash leftovers (unbound intents, dead claims) are repaired")
	grace := c.Duration("intent-grace", 15*time.Second, "how long an unbound intent is left to the process that wrote it")
	listenStreams := c.Int("listen-streams", 10, "subscriptions/listen streams one caller may hold open on this replica")
	listenLifetime := c.Duration("listen-lifetime", 30*time.Minute, "longest a subscriptions/listen stream stays open; then it ends and the client listens again")
	decisionCache := c.Int("decision-cache", pep.DefaultDecisionCache, "allowed decisions the PDP marks cacheable remembered for reuse, while the backend's change stream is heard (every policy, attribute, directory or client change empties them); 0: none, every call asks the PDP")
	decisionMaxAge := c.Duration("decision-cache-max-age", pep.DefaultDecisionMaxAge, "longest an allowed decision is reused (the PDP's own bound applies too)")
	doMigrate := c.Bool("migrate", false, "apply pending migrations before starting")
	conformance := c.Bool("conformance-fixtures", false, "also serve the official MCP conformance suite's fixture tools, and let requests without a token in as an anonymous caller (for conformance testing only, never in production)")
	approvalTools := c.Bool("approval-tools", false, "let clients that do not drive tasks get calls approved: a requestable call makes the request and answers with a handle, followed with the approval_status tool; the same call made again after approval runs it once")
	oauthIssuers := c.String("oauth-issuers", "", "OAuth authorization servers (issuer URLs, comma-separated) whose JWT access tokens admit MCP callers, beside arap's caller tokens (MCP authorization); their metadata and keys are fetched")
	oauthResource := c.String("oauth-resource", "", "this MCP endpoint's canonical URL, the audience an access token must name (default: the public URL's /mcp)")
	oauthScopes := c.String("oauth-scopes", "", "scopes every access token must carry, comma-separated (advertised in the protected resource metadata)")
	oauthSubject := c.String("oauth-subject-claim", "sub", "the access token claim naming the caller's subject")
	oauthClientID := c.String("oauth-introspection-client-id", "", "this server's client id at the authorization servers, for introspecting opaque access tokens (RFC 7662); none: opaque tokens are refused")
	oauthClientSecret := c.Secret("oauth-introspection-client-secret", "the introspection client's secret")
	demo := c.Bool("demo-tools", false, "also offer the demo tools (wire_transfer, delete_repository, ...: their side effects are rows in a ledger table), to try arap; never in production")
	level := logLevel(c)
	trusted := trustedProxies(c)
	metrics := metricsAddr(c)
	if err := c.Parse(args); err != nil {
		return err
	}
	if !token.IsSet() {
		return fmt.Errorf("the front-end's API token at the backend (scopes evaluate and request) is required: %s", token.Describe())
	}
	masterKey, err := decodeMasterKey(key)
	if err != nil {
		return err
	}
	previous, err := previousKeys(prevKeys)
	if err != nil {
		return err
	}
	proxies, err := clientip.ParsePrefixes(*trusted)
	if err != nil {
		return fmt.Errorf("--trusted-proxies: %w", err)
	}
	var webhookSecrets []string
	for _, s := range strings.Split(secrets.Value(), ",") {
		if s = strings.TrimSpace(s); s != "" {
			webhookSecrets = append(webhookSecrets, s)
		}
	}
	ctx, reload := signals()
	log := logger(*level)
	flush, err := tracing("arapd-mcp")
	if err != nil {
		return err
	}
	defer flush()
	cfg := frontend.Config{
		Addr: *addr, PublicURL: *public, DatabaseURL: dbURL.Value(), ListenURL: listen.Value(), MasterKey: masterKey, PreviousMasterKeys: previous, BackendURL: *backendURL, BackendToken: token.Value(),
		WebhookSecrets: webhookSecrets, Upstreams: *upstreams, Migrate: *doMigrate, PollInterval: *poll, ExecTimeout: *execTimeout, MaxWindow: *maxWindow, IntentGrace: *grace, ReconcileEvery: *reconcile,
		ListenStreams: *listenStreams, ListenLifetime: *listenLifetime, Log: log, TrustedProxies: proxies, MetricsAddr: *metrics,
		ApprovalTools: *approvalTools, DecisionCache: *decisionCache, DecisionMaxAge: *decisionMaxAge,
	}
	if cfg.DecisionCache <= 0 || cfg.DecisionMaxAge <= 0 {
		cfg.DecisionCache = -1 // off
	}
	if *oauthIssuers != "" {
		cfg.OAuth = &agentauth.Config{Issuers: splitList(*oauthIssuers), Resource: *oauthResource, Scopes: splitList(*oauthScopes), SubjectClaim: *oauthSubject}
		if *oauthClientID != "" {
			cfg.OAuth.Introspect = &agentauth.Client{ID: *oauthClientID, Secret: oauthClientSecret.Value()}
		}
	}
	if *demo {
		log.Warn("offering the demo tools (--demo-tools): their side effects are rows in a ledger table, nothing real; never in production")
		cfg.Tools = pep.DemoTools()
	}
	if *conformance {
		withFixtures(&cfg)
	}
	f, err := frontend.New(ctx, cfg)
	if err != nil {
		return err
	}
	return f.Run(ctx, reload)
}

// withFixtures turns on conformance fixture mode: the suite's fixture tools
// and an anonymous principal for requests without a token.
func withFixtures(cfg *frontend.Config) {
	cfg.Log.Warn("conformance fixture mode: serving the MCP conformance suite's fixture tools and accepting requests without a token as an anonymous caller; this is for conformance testing only, never run it in production",
		"anonymous_subject", fixtures.Principal.SubjectID)
	var runs *fixtures.Runtime
	cfg.Extra = fixtures.Install(cfg.Log, &runs)
	cfg.Stopping = func() {
		if runs != nil {
			runs.Close()
		}
	}
	p := fixtures.Principal
	cfg.Anonymous = &p
}

// tuneGC sets the garbage collector of arapd mcp, unless GOGC or GOMEMLIMIT
// say otherwise. The MCP SDK allocates a 32 KB buffer for every JSON value
// it decodes, about twenty for one tool call forwarded to an upstream, while
// the live heap stays near 10 MB: at Go's default (GOGC=100) the gateway
// spent about a third of its CPU collecting (pprof, docs/performance.md).
// Collecting at five times the live heap rather than twice cuts that to a
// fraction; the soft limit keeps the heap, and so the process, well under
// the 200 MB it is meant to stay within (docs/performance.md) when the live
// heap grows.
func tuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(160 << 20)
	}
}

// splitList splits a comma- or space-separated setting.
func splitList(v string) []string {
	return strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' })
}
