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
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	_ "net/http/pprof"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/arap"
	"github.com/omcp/arap/backend"
	"github.com/omcp/arap/frontend"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/internal/telemetry"
	"github.com/omcp/arap/mcp/fixtures"
	"github.com/omcp/arap/migrations"
	"github.com/omcp/arap/notify"
	"github.com/omcp/arap/slackapp"
	"github.com/omcp/arap/sso"
)

const usage = `usage: arapd <command> [flags]

commands:
  serve     run the backend (AuthZEN PDP, ARAP Access Request Service, workers)
  mcp       run the MCP front-end (the policy enforcement point)
  dev       run everything locally with a private PostgreSQL and seed data
  migrate   apply database migrations

Run "arapd <command> -h" for the flags of a command.
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
	default:
		fmt.Fprintf(os.Stderr, "arapd: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "arapd:", err)
		os.Exit(1)
	}
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	return def
}

func envInt(name string, def int) int {
	if v := os.Getenv(name); v != "" {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return def
}

func logger(level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	// issue21-obs: records logged with a traced context carry its ids.
	return slog.New(telemetry.LogHandler(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: l})))
}

// issue21-obs
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
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	addr := fs.String("addr", env("ARAP_ADDR", "127.0.0.1:8480"), "listen address (ARAP_ADDR)")
	public := fs.String("public-url", env("ARAP_PUBLIC_URL", ""), "external base URL, e.g. https://arap.example.com (ARAP_PUBLIC_URL; default http://<addr>)")
	dbURL := fs.String("database-url", env("DATABASE_URL", ""), "PostgreSQL URL (DATABASE_URL)")
	policy := fs.String("policy", env("ARAP_POLICY", ""), "policy file (ARAP_POLICY); reloaded on SIGHUP")
	keyFile := fs.String("master-key-file", env("ARAP_MASTER_KEY_FILE", ""), "file holding the base64 32-byte master key (ARAP_MASTER_KEY_FILE, or the key itself in ARAP_MASTER_KEY)")
	doMigrate := fs.Bool("migrate", false, "apply pending migrations before starting")
	jobTimeout := fs.Duration("job-timeout", envDuration("ARAP_JOB_TIMEOUT", time.Minute), "bound on a background job; a job whose worker died is retried after twice this (ARAP_JOB_TIMEOUT)")
	rate := fs.Int("rate-limit", arap.DefaultLimits.RequestsPerMinute, "requests per minute each API client may make (all replicas together)")
	level := fs.String("log-level", env("ARAP_LOG_LEVEL", "info"), "debug, info, warn or error")
	smtpURL := fs.String("smtp-url", env("ARAP_SMTP_URL", ""), "SMTP server for e-mail notifications: smtp://host[:port] (STARTTLS), smtps://host[:port] (TLS) (ARAP_SMTP_URL; e-mail is off without it)")
	smtpUser := fs.String("smtp-username", env("ARAP_SMTP_USERNAME", ""), "SMTP user name (ARAP_SMTP_USERNAME); the password is read from ARAP_SMTP_PASSWORD or --smtp-password-file")
	smtpPasswordFile := fs.String("smtp-password-file", env("ARAP_SMTP_PASSWORD_FILE", ""), "file holding the SMTP password (ARAP_SMTP_PASSWORD_FILE)")
	mailFrom := fs.String("mail-from", env("ARAP_MAIL_FROM", ""), "sender address of notifications (ARAP_MAIL_FROM)")
	slackTokenFile := fs.String("slack-token-file", env("ARAP_SLACK_TOKEN_FILE", ""), "file holding the Slack bot token (ARAP_SLACK_TOKEN_FILE, or the token itself in ARAP_SLACK_TOKEN); Slack is off without it")
	slackSecretFile := fs.String("slack-signing-secret-file", env("ARAP_SLACK_SIGNING_SECRET_FILE", ""), "file holding the Slack app's signing secret (ARAP_SLACK_SIGNING_SECRET_FILE, or ARAP_SLACK_SIGNING_SECRET); without it the Approve and Deny buttons are refused")
	slackAPI := fs.String("slack-api-url", env("ARAP_SLACK_API_URL", ""), "Slack Web API base URL, for tests (ARAP_SLACK_API_URL; default https://slack.com/api/)")
	oidcIssuer := fs.String("oidc-issuer", env("ARAP_OIDC_ISSUER", ""), "OpenID provider's issuer URL for approver sign-in to the web UI (ARAP_OIDC_ISSUER; off without it); the redirect URL to register is <public-url>/ui/oidc/callback")
	oidcClient := fs.String("oidc-client-id", env("ARAP_OIDC_CLIENT_ID", ""), "client id at the OpenID provider (ARAP_OIDC_CLIENT_ID)")
	oidcSecretFile := fs.String("oidc-client-secret-file", env("ARAP_OIDC_CLIENT_SECRET_FILE", ""), "file holding the client secret (ARAP_OIDC_CLIENT_SECRET_FILE, or the secret itself in ARAP_OIDC_CLIENT_SECRET)")
	oidcGroups := fs.String("oidc-groups-claim", env("ARAP_OIDC_GROUPS_CLAIM", ""), "ID token claim listing the user's groups; its values naming directory groups become the user's memberships at every sign-in (ARAP_OIDC_GROUPS_CLAIM; off without it)")
	oidcScopes := fs.String("oidc-scopes", env("ARAP_OIDC_SCOPES", "openid email profile"), "scopes requested, space-separated (ARAP_OIDC_SCOPES)")
	oidcName := fs.String("oidc-name", env("ARAP_OIDC_NAME", ""), "the provider's name on the sign-in button (ARAP_OIDC_NAME)")
	localPasswords := fs.Bool("local-passwords", envBool("ARAP_LOCAL_PASSWORDS", true), "allow sign-in to the web UI with local passwords (ARAP_LOCAL_PASSWORDS); false needs --oidc-issuer")
	// issue21-obs
	metricsAddr := fs.String("metrics-addr", env("ARAP_METRICS_ADDR", ""), "serve /metrics on this address only, not on --addr (ARAP_METRICS_ADDR; default: on --addr)")
	_ = fs.Parse(args)
	log := logger(*level)
	flush, err := tracing("arapd-serve")
	if err != nil {
		return err
	}
	defer flush()
	key, err := masterKey(*keyFile)
	if err != nil {
		return err
	}
	mail, err := mailConfig(*smtpURL, *smtpUser, *smtpPasswordFile, *mailFrom)
	if err != nil {
		return err
	}
	slackConf, err := slackConfig(*slackTokenFile, *slackSecretFile, *slackAPI)
	if err != nil {
		return err
	}
	if v := os.Getenv("ARAP_LOCAL_PASSWORDS"); v != "" {
		if _, err := strconv.ParseBool(v); err != nil {
			return fmt.Errorf("ARAP_LOCAL_PASSWORDS=%q: want true or false", v)
		}
	}
	oidcConf, err := oidcConfig(*oidcIssuer, *oidcClient, *oidcSecretFile, *oidcGroups, *oidcScopes, *oidcName)
	if err != nil {
		return err
	}
	ctx, reload := signals()
	b, err := backend.New(ctx, backend.Config{
		Addr: *addr, PublicURL: *public, DatabaseURL: *dbURL, PolicyFile: *policy, MasterKey: key, Migrate: *doMigrate, Log: log,
		JobTimeout: *jobTimeout, Limits: arap.Limits{RequestsPerMinute: *rate}, Mail: mail, Slack: slackConf,
		OIDC: oidcConf, NoLocalPasswords: !*localPasswords,
		MetricsAddr: *metricsAddr, // issue21-obs
	})
	if err != nil {
		return err
	}
	return b.Run(ctx, reload)
}

// mailConfig is the e-mail channel's configuration, or nil (e-mail off)
// without an SMTP URL. The password never comes from a flag (flags show in
// the process list): ARAP_SMTP_PASSWORD or a file.
func mailConfig(smtpURL, user, passwordFile, from string) (*notify.EmailConfig, error) {
	if smtpURL == "" {
		if user != "" || passwordFile != "" || from != "" {
			return nil, errors.New("--smtp-username, --smtp-password-file and --mail-from need --smtp-url (ARAP_SMTP_URL)")
		}
		return nil, nil
	}
	password := os.Getenv("ARAP_SMTP_PASSWORD")
	if passwordFile != "" {
		b, err := os.ReadFile(passwordFile)
		if err != nil {
			return nil, fmt.Errorf("SMTP password: %w", err)
		}
		password = strings.TrimRight(string(b), "\r\n")
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
// a token. Secrets come from the environment or files, never flags.
func slackConfig(tokenFile, secretFile, apiURL string) (*slackapp.Config, error) {
	read := func(what, envName, file string) (string, error) {
		v := os.Getenv(envName)
		if file != "" {
			b, err := os.ReadFile(file)
			if err != nil {
				return "", fmt.Errorf("%s: %w", what, err)
			}
			v = string(b)
		}
		return strings.TrimSpace(v), nil
	}
	token, err := read("Slack token", "ARAP_SLACK_TOKEN", tokenFile)
	if err != nil {
		return nil, err
	}
	secret, err := read("Slack signing secret", "ARAP_SLACK_SIGNING_SECRET", secretFile)
	if err != nil {
		return nil, err
	}
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
// local passwords only) without an issuer. The secret comes from the
// environment or a file, never a flag.
func oidcConfig(issuer, clientID, secretFile, groupsClaim, scopes, name string) (*sso.Config, error) {
	secret := os.Getenv("ARAP_OIDC_CLIENT_SECRET")
	if secretFile != "" {
		b, err := os.ReadFile(secretFile)
		if err != nil {
			return nil, fmt.Errorf("OIDC client secret: %w", err)
		}
		secret = strings.TrimSpace(string(b))
	}
	if issuer == "" {
		if clientID != "" || secret != "" || groupsClaim != "" || name != "" {
			return nil, errors.New("--oidc-client-id, the client secret, --oidc-groups-claim and --oidc-name need --oidc-issuer (ARAP_OIDC_ISSUER)")
		}
		return nil, nil
	}
	return &sso.Config{Issuer: issuer, ClientID: clientID, ClientSecret: secret, GroupsClaim: groupsClaim, Scopes: strings.Fields(scopes), Name: name}, nil
}

func envBool(name string, def bool) bool {
	if v := os.Getenv(name); v != "" {
		if b, err := strconv.ParseBool(v); err == nil {
			return b
		}
	}
	return def
}

func masterKey(file string) ([]byte, error) { return masterKeyFrom("ARAP_MASTER_KEY", file) }

func masterKeyFrom(envName, file string) ([]byte, error) {
	raw := os.Getenv(envName)
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("master key: %w", err)
		}
		raw = string(b)
	}
	if raw == "" {
		return nil, fmt.Errorf("a master key is required: set %s (base64 of 32 random bytes, e.g. `openssl rand -base64 32`) or --master-key-file", envName)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(raw))
	if err != nil || len(key) != 32 {
		return nil, errors.New("the master key must be the base64 encoding of exactly 32 bytes")
	}
	return key, nil
}

func migrate(args []string) error {
	fs := flag.NewFlagSet("migrate", flag.ExitOnError)
	dbURL := fs.String("database-url", env("DATABASE_URL", ""), "PostgreSQL URL (DATABASE_URL)")
	_ = fs.Parse(args)
	if *dbURL == "" {
		return errors.New("--database-url or DATABASE_URL is required")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	return migrations.Up(ctx, pool, logger("info"))
}

func runDev(args []string) error {
	fs := flag.NewFlagSet("dev", flag.ExitOnError)
	opts := dev.Options{}
	fs.StringVar(&opts.Addr, "addr", "127.0.0.1:8480", "backend and web UI address")
	fs.StringVar(&opts.MCPAddr, "mcp-addr", "127.0.0.1:8481", "MCP endpoint address")
	fs.StringVar(&opts.DataDir, "data-dir", dev.DefaultDataDir, "where the private PostgreSQL cluster, policy and keys live")
	fs.StringVar(&opts.DatabaseURL, "database-url", os.Getenv("DATABASE_URL"), "use this database instead of a private cluster (DATABASE_URL)")
	fs.StringVar(&opts.Upstreams, "upstreams", env("ARAP_UPSTREAMS", ""), "upstreams file: MCP servers whose tools the MCP endpoint offers behind the PDP (ARAP_UPSTREAMS; reloaded on SIGHUP)")
	conformance := fs.Bool("conformance-fixtures", false, "also serve the official MCP conformance suite's fixture tools on the MCP endpoint, and let requests without a token in as an anonymous caller (conformance testing only)")
	level := fs.String("log-level", env("ARAP_LOG_LEVEL", "info"), "debug, info, warn or error")
	_ = fs.Parse(args)
	opts.Log = logger(*level)
	opts.Out = os.Stdout
	flush, err := tracing("arapd-dev") // issue21-obs
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
	fs := flag.NewFlagSet("mcp", flag.ExitOnError)
	addr := fs.String("addr", env("ARAP_MCP_ADDR", "127.0.0.1:8481"), "listen address (ARAP_MCP_ADDR)")
	public := fs.String("public-url", env("ARAP_MCP_PUBLIC_URL", ""), "base URL the backend uses for callbacks (ARAP_MCP_PUBLIC_URL; default http://<addr>)")
	dbURL := fs.String("database-url", env("DATABASE_URL", ""), "PostgreSQL URL (DATABASE_URL); the front-end's own tables live in schema pep")
	backendURL := fs.String("backend-url", env("ARAP_BACKEND_URL", "http://127.0.0.1:8480"), "the backend (PDP and Access Request Service) base URL (ARAP_BACKEND_URL)")
	upstreams := fs.String("upstreams", env("ARAP_UPSTREAMS", ""), "upstreams file: MCP servers whose tools are offered behind the PDP (ARAP_UPSTREAMS; reloaded on SIGHUP)")
	keyFile := fs.String("master-key-file", env("ARAP_PEP_MASTER_KEY_FILE", ""), "file with the base64 32-byte key sealing stored arguments (or ARAP_PEP_MASTER_KEY)")
	execTimeout := fs.Duration("exec-timeout", envDuration("ARAP_EXEC_TIMEOUT", 30*time.Second), "bound on one tool run and the writing of its outcome (the run gets all but a fifth, at most 5s); a claimed run not recorded by then ends outcome-unknown (ARAP_EXEC_TIMEOUT)")
	maxWindow := fs.Duration("max-window", envDuration("ARAP_MAX_WINDOW", 7*24*time.Hour), "longest a task waits for a decision, whatever the backend allows; then it ends denied (ARAP_MAX_WINDOW)")
	poll := fs.Duration("poll-interval", envDuration("ARAP_POLL_INTERVAL", 2*time.Second), "pollIntervalMs suggested to clients and the first backend poll delay (ARAP_POLL_INTERVAL)")
	reconcile := fs.Duration("reconcile-every", envDuration("ARAP_RECONCILE_EVERY", 10*time.Second), "how often crash leftovers (unbound intents, dead claims) are repaired (ARAP_RECONCILE_EVERY)")
	grace := fs.Duration("intent-grace", envDuration("ARAP_INTENT_GRACE", 15*time.Second), "how long an unbound intent is left to the process that wrote it (ARAP_INTENT_GRACE)")
	listenStreams := fs.Int("listen-streams", envInt("ARAP_LISTEN_STREAMS", 10), "subscriptions/listen streams one caller may hold open on this replica (ARAP_LISTEN_STREAMS)")
	listenLifetime := fs.Duration("listen-lifetime", envDuration("ARAP_LISTEN_LIFETIME", 30*time.Minute), "longest a subscriptions/listen stream stays open; then it ends and the client listens again (ARAP_LISTEN_LIFETIME)")
	doMigrate := fs.Bool("migrate", false, "apply pending migrations before starting")
	conformance := fs.Bool("conformance-fixtures", false, "also serve the official MCP conformance suite's fixture tools, and let requests without a token in as an anonymous caller (for conformance testing only, never in production)")
	level := fs.String("log-level", env("ARAP_LOG_LEVEL", "info"), "debug, info, warn or error")
	// issue21-obs
	metricsAddr := fs.String("metrics-addr", env("ARAP_METRICS_ADDR", ""), "serve /metrics on this address only, not on --addr (ARAP_METRICS_ADDR; default: on --addr)")
	_ = fs.Parse(args)
	flush, err := tracing("arapd-mcp")
	if err != nil {
		return err
	}
	defer flush()
	token := os.Getenv("ARAP_BACKEND_TOKEN")
	if token == "" {
		return errors.New("ARAP_BACKEND_TOKEN (the front-end's API token at the backend, scopes evaluate and request) is required")
	}
	key, err := masterKeyFrom("ARAP_PEP_MASTER_KEY", *keyFile)
	if err != nil {
		return err
	}
	var secrets []string
	for _, s := range strings.Split(os.Getenv("ARAP_WEBHOOK_SECRETS"), ",") {
		if s = strings.TrimSpace(s); s != "" {
			secrets = append(secrets, s)
		}
	}
	ctx, reload := signals()
	log := logger(*level)
	cfg := frontend.Config{
		Addr: *addr, PublicURL: *public, DatabaseURL: *dbURL, MasterKey: key, BackendURL: *backendURL, BackendToken: token,
		WebhookSecrets: secrets, Upstreams: *upstreams, Migrate: *doMigrate, PollInterval: *poll, ExecTimeout: *execTimeout, MaxWindow: *maxWindow, IntentGrace: *grace, ReconcileEvery: *reconcile,
		ListenStreams: *listenStreams, ListenLifetime: *listenLifetime, Log: log,
		MetricsAddr: *metricsAddr, // issue21-obs
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
