// Package dev runs `arapd dev`: a private PostgreSQL cluster (or the given
// database), migrations, seed data with fixed tokens, and the backend, all on
// loopback. Like `vault server -dev`: one command, then it prints what to
// open and which tokens to use. Nothing here is for production.
package dev

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/omcp/arap/backend"
	"github.com/omcp/arap/callbacks"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/directory"
	"github.com/omcp/arap/frontend"
	"github.com/omcp/arap/internal/mailsink"
	"github.com/omcp/arap/internal/pgembed"
	"github.com/omcp/arap/notify"
	"github.com/omcp/arap/passkeys"
	"github.com/omcp/arap/pep"
)

//go:embed policy.yaml
var seedPolicy []byte

// SeedPolicy is the dev-mode policy document.
func SeedPolicy() []byte { return seedPolicy }

// Fixed dev-only tokens (DESIGN.md, "Dev mode, pinned").
const (
	PEPToken = "dev-pep-token"
	// PEPWebhookSecret signs callbacks to the dev PEP (the MCP front-end).
	PEPWebhookSecret = "whsec_ZGV2LXdlYmhvb2stc2VjcmV0LWRvLW5vdC11c2U="
	ResolverToken    = "dev-resolver-token"
	ITSMToken        = "dev-itsm-token"
	// AdminToken is an API client with scope admin (`arapctl policy
	// reload`).
	AdminToken = "dev-admin-token"
	// AgentToken is an MCP caller acting for alice through agent:demo;
	// Agent2Token one acting for mallory; BobAgentToken one acting for bob,
	// a treasury approver, to show that nobody decides their own request.
	AgentToken    = "dev-agent-token"
	Agent2Token   = "dev-agent2-token"
	BobAgentToken = "dev-bob-agent-token"
)

// DefaultDataDir is where `arapd dev` keeps its state unless --data-dir
// says otherwise.
const DefaultDataDir = ".arap-dev"

// DatabaseURLFile, under the data dir, holds the URL of the database Run
// uses. The private cluster listens on a socket in a directory of its own,
// named nowhere else, and arapctl's database commands read this file when
// DATABASE_URL is unset.
const DatabaseURLFile = "database-url"

// The dev mail sink: notifications' sender, and where the received
// messages are listed (MailPath, and MailPath+".json").
const (
	MailFrom = "arap-dev@localhost"
	MailPath = "/dev/mail"
)

// Options configure Run.
type Options struct {
	Addr        string
	MCPAddr     string
	DataDir     string
	DatabaseURL string
	// Upstreams is the MCP front-end's upstreams file ("" for none).
	Upstreams string
	// Frontend, when set, adjusts the MCP front-end's configuration before
	// it is built (`arapd dev --conformance-fixtures` adds the fixtures).
	Frontend func(*frontend.Config)
	Log      *slog.Logger
	Out      io.Writer
}

// Run brings everything up and serves until ctx ends.
func Run(ctx context.Context, o Options, reload <-chan struct{}) error {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	dataDir, err := filepath.Abs(o.DataDir)
	if err != nil {
		return err
	}
	// 0711: the PostgreSQL account (when we run as root) must be able to
	// enter it to reach its cluster; the secrets inside are 0600 files.
	if err := os.MkdirAll(dataDir, 0o711); err != nil {
		return fmt.Errorf("dev: data dir: %w", err)
	}
	_ = os.Chmod(dataDir, 0o711)
	keyFile := filepath.Join(dataDir, "master.key")
	_, statErr := os.Stat(keyFile)
	fresh := errors.Is(statErr, os.ErrNotExist)

	dbURL := o.DatabaseURL
	if dbURL == "" {
		cluster, err := startCluster(ctx, dataDir, fresh, o.Log)
		if err != nil {
			return err
		}
		defer cluster.Stop(context.Background()) //nolint:errcheck
		if dbURL, err = ensureDatabase(ctx, cluster, "arap"); err != nil {
			return err
		}
	}
	if err := recordDatabaseURL(dataDir, dbURL); err != nil {
		return err
	}
	key, err := masterKey(keyFile)
	if err != nil {
		return err
	}
	policyFile := filepath.Join(dataDir, "policy.yaml")
	if err := writePolicy(policyFile, o.Log); err != nil {
		return err
	}

	// Notifications go to a mail sink on loopback, a real SMTP server in
	// this process, listed at /dev/mail: no outside service is needed.
	sink, err := mailsink.Start(mailsink.Options{Addr: "127.0.0.1:0"})
	if err != nil {
		return err
	}
	defer sink.Close() //nolint:errcheck
	b, err := backend.New(ctx, backend.Config{
		Addr: o.Addr, DatabaseURL: dbURL, PolicyFile: policyFile, MasterKey: key, Migrate: true, Log: o.Log,
		Mail:    &notify.EmailConfig{URL: "smtp+insecure://" + sink.Addr(), From: MailFrom},
		DevMail: sink.Handler(MailPath),
	})
	if err != nil {
		return err
	}
	if err := Seed(ctx, b.Clients(), b.Directory(), b.Callbacks()); err != nil {
		_ = b.Stop(context.Background())
		return err
	}
	pepKey, err := masterKey(filepath.Join(dataDir, "pep.key"))
	if err != nil {
		return err
	}
	fcfg := frontend.Config{
		Addr: o.MCPAddr, DatabaseURL: dbURL, MasterKey: pepKey, BackendURL: b.URL(), BackendToken: PEPToken,
		WebhookSecrets: []string{PEPWebhookSecret}, Upstreams: o.Upstreams, Tools: pep.DemoTools(), ApprovalTools: true, Log: o.Log,
	}
	if o.Frontend != nil {
		o.Frontend(&fcfg)
	}
	f, err := frontend.New(ctx, fcfg)
	if err != nil {
		_ = b.Stop(context.Background())
		return err
	}
	if err := SeedCallers(ctx, f.Gate().Callers()); err != nil {
		return err
	}
	printBanner(o.Out, b.URL(), f.URL()+pep.PathMCP, policyFile, dataDir, displayURL(dbURL))
	// SIGHUP reloads both: the backend's policy, the front-end's upstreams.
	breload, freload := fanOut(reload)
	backendDone := make(chan error, 1)
	go func() { backendDone <- b.Run(ctx, breload) }()
	ferr := f.Run(ctx, freload)
	return errors.Join(ferr, <-backendDone)
}

// fanOut copies every value from in to both outputs (without blocking: a
// reload already pending covers the next).
func fanOut(in <-chan struct{}) (<-chan struct{}, <-chan struct{}) {
	if in == nil {
		return nil, nil
	}
	a, b := make(chan struct{}, 1), make(chan struct{}, 1)
	go func() {
		for range in {
			for _, c := range []chan struct{}{a, b} {
				select {
				case c <- struct{}{}:
				default:
				}
			}
		}
	}()
	return a, b
}

// SeedCallers registers the dev MCP callers: dev-agent-token acts for alice
// through agent:demo, dev-agent2-token for mallory, dev-bob-agent-token for bob.
func SeedCallers(ctx context.Context, c *pep.Callers) error {
	for _, s := range []struct {
		name, token string
		p           pep.Principal
	}{
		{"dev-agent", AgentToken, pep.Principal{SubjectType: "user", SubjectID: "alice", ActorID: "agent:demo"}},
		{"dev-agent2", Agent2Token, pep.Principal{SubjectType: "user", SubjectID: "mallory", ActorID: "agent:demo"}},
		{"dev-bob-agent", BobAgentToken, pep.Principal{SubjectType: "user", SubjectID: "bob", ActorID: "agent:demo"}},
	} {
		if err := c.Create(ctx, s.name, s.token, s.p); err != nil && !strings.Contains(err.Error(), "exists") {
			return fmt.Errorf("dev: seed caller: %w", err)
		}
	}
	return nil
}

// startCluster starts the private cluster under dataDir/pg. When the process
// is root and the data dir is inside a directory the server account cannot
// enter (such as /root), the cluster goes to a directory under /tmp instead;
// a cluster left there by an earlier data dir of the same name (fresh: this
// data dir has no master key yet) is unusable without its key and removed.
func startCluster(ctx context.Context, dataDir string, fresh bool, log *slog.Logger) (*pgembed.Cluster, error) {
	pgDir := filepath.Join(dataDir, "pg")
	c, err := pgembed.Start(ctx, pgembed.Options{DataDir: pgDir})
	var nt *pgembed.NotTraversableError
	if errors.As(err, &nt) {
		altBase := filepath.Join(os.TempDir(), "arap-dev-"+strings.NewReplacer("/", "_").Replace(strings.Trim(dataDir, "/")))
		if fresh {
			_ = os.RemoveAll(altBase)
		}
		alt := filepath.Join(altBase, "pg")
		log.Warn("the PostgreSQL account cannot reach the data dir; keeping the cluster elsewhere", "data_dir", dataDir, "cluster", alt)
		if err := os.MkdirAll(altBase, 0o755); err != nil {
			return nil, err
		}
		c, err = pgembed.Start(ctx, pgembed.Options{DataDir: alt})
	}
	if err != nil {
		return nil, fmt.Errorf("dev: %w", err)
	}
	return c, nil
}

func ensureDatabase(ctx context.Context, c *pgembed.Cluster, name string) (string, error) {
	conn, err := pgx.Connect(ctx, c.ConnString("postgres"))
	if err != nil {
		return "", fmt.Errorf("dev: connect: %w", err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", err
	}
	if !exists {
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			return "", fmt.Errorf("dev: create database: %w", err)
		}
	}
	return c.ConnString(name), nil
}

// recordDatabaseURL writes url to the data dir's DatabaseURLFile, readable
// by the user alone (it may hold a password), replacing the file whole so
// that a reader never sees half of it.
func recordDatabaseURL(dataDir, url string) error {
	tmp, err := os.CreateTemp(dataDir, ".database-url-*")
	if err != nil {
		return fmt.Errorf("dev: record the database URL: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(url + "\n")
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(dataDir, DatabaseURLFile))
	}
	if err != nil {
		return fmt.Errorf("dev: record the database URL: %w", err)
	}
	return nil
}

// displayURL is a database URL to print: its password, if any, masked.
func displayURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		return "(given in DATABASE_URL)"
	}
	return u.Redacted()
}

// masterKey reads the dev master key, creating it on first run.
func masterKey(path string) ([]byte, error) {
	if b, err := os.ReadFile(path); err == nil {
		key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
		if err != nil || len(key) != 32 {
			return nil, fmt.Errorf("dev: %s is not a base64 32-byte key; delete it (and the data dir) to start over", path)
		}
		return key, nil
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	if err := os.WriteFile(path, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("dev: write master key: %w", err)
	}
	return key, nil
}

// writePolicy installs the seed policy unless the file exists; an existing
// file is the user's and is kept (with a note when it differs from the seed).
func writePolicy(path string, log *slog.Logger) error {
	cur, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return os.WriteFile(path, seedPolicy, 0o600)
	}
	if err != nil {
		return err
	}
	if string(cur) != string(seedPolicy) {
		log.Info("keeping the existing dev policy, which differs from the built-in seed; delete it to get the seed back", "policy", path)
	}
	return nil
}

// Password is every dev user's password.
const Password = "dev-password"

// Users and groups of dev mode: alice and mallory request; bob and carol
// approve for treasury, dave and erin for platform.
var (
	Users  = []string{"alice", "bob", "carol", "dave", "erin", "mallory"}
	Groups = map[string][]string{"treasury": {"bob", "carol"}, "platform": {"dave", "erin"}}
)

// Seed creates the dev API clients with their fixed tokens, and the dev
// users and groups; existing ones are left alone, so a restart keeps state.
func Seed(ctx context.Context, store *clients.Store, people *directory.Store, cbs *callbacks.Service) error {
	for _, u := range Users {
		err := people.CreateUser(ctx, directory.User{Name: u, DisplayName: strings.ToUpper(u[:1]) + u[1:], Email: u + "@example.com"}, Password, "dev-seed")
		if err != nil && !errors.Is(err, directory.ErrExists) {
			return fmt.Errorf("dev: seed user %s: %w", u, err)
		}
	}
	for g, members := range Groups {
		if err := people.CreateGroup(ctx, g, "dev-seed"); err != nil && !errors.Is(err, directory.ErrExists) {
			return fmt.Errorf("dev: seed group %s: %w", g, err)
		}
		for _, m := range members {
			if err := people.AddMember(ctx, g, m, "dev-seed"); err != nil {
				return fmt.Errorf("dev: seed group %s: %w", g, err)
			}
		}
	}
	seed := []clients.New{
		{Name: "dev-pep", Token: PEPToken, Scopes: []string{clients.ScopeEvaluate, clients.ScopeRequest}, Kind: clients.KindAutomation, Actors: []string{"agent:*"},
			CallbackPrefixes: []string{"http://127.0.0.1:", "http://localhost:"}, CallbackNetworks: []string{clients.NetworkLoopback}},
		{Name: "dev-resolver", Token: ResolverToken, Scopes: []string{clients.ScopeDecide}, Kind: clients.KindAutomation},
		{Name: "dev-itsm", Token: ITSMToken, Scopes: []string{clients.ScopeDecide, clients.ScopeDecideForPeople}, Kind: clients.KindITSM},
		{Name: "dev-admin", Token: AdminToken, Scopes: []string{clients.ScopeAdmin}, Kind: clients.KindAutomation},
	}
	for _, n := range seed {
		_, _, err := store.Create(ctx, n, "dev-seed")
		if err != nil && !errors.Is(err, clients.ErrNameTaken) {
			return fmt.Errorf("dev: seed client %s: %w", n.Name, err)
		}
	}
	pep, err := store.Get(ctx, "dev-pep")
	if err != nil {
		return err
	}
	has, err := cbs.HasSecret(ctx, pep.ID)
	if err != nil {
		return err
	}
	if !has {
		if _, err := cbs.RotateSecret(ctx, pep.ID, 0, PEPWebhookSecret, "dev-seed"); err != nil {
			return fmt.Errorf("dev: seed webhook secret: %w", err)
		}
	}
	return nil
}

// passkeyHint says where the UI takes passkeys when the dev URL is an IP
// address, which cannot be a WebAuthn relying party id: the same listener
// as localhost.
func passkeyHint(url string) string {
	_, origin, err := passkeys.RelyingParty(url)
	if err != nil || origin == url {
		return ""
	}
	return "\n    passkeys (rules with approval.require_passkey) work at " + origin + "/ui/ (an IP address cannot be a WebAuthn relying party id)"
}

func printBanner(w io.Writer, url, mcpURL, policy, dataDir, dbURL string) {
	file := filepath.Join(dataDir, DatabaseURLFile)
	dbHint := "(in " + file + "; arapctl run in this directory uses it)"
	if cwd, err := os.Getwd(); err != nil || filepath.Join(cwd, DefaultDataDir) != dataDir {
		dbHint = "(in " + file + "; for arapctl: export DATABASE_URL=$(cat " + file + "))"
	}
	fmt.Fprintf(w, `
arap dev server: DEVELOPMENT ONLY (fixed tokens, local data)

  Approver web UI                %[1]s/ui/
    sign in as bob or carol (treasury), dave or erin (platform); password %[11]s%[15]s
  Backend (AuthZEN PDP + ARAP)  %[1]s
  Notifications (mail sink)      %[1]s/dev/mail
  MCP endpoint                   %[8]s
  Policy                         %[2]s
    edit it, then: kill -HUP %[16]d, or
    ARAP_TOKEN=%[17]s bin/arapctl policy reload   (check it first: bin/arapctl policy check FILE)
  Data                           %[3]s
  Database                       %[13]s
    %[14]s

  API tokens: PEP %[4]s, automated resolver %[5]s, ITSM %[6]s
  MCP callers: %[9]s (alice via agent:demo), %[10]s (mallory),
               %[12]s (bob, who cannot decide his own requests)

  Walkthrough (docs/walkthrough.md), in a second terminal:
    go build -o bin/arapctl ./cmd/arapctl
    export ARAP_MCP_URL=%[8]s ARAP_MCP_TOKEN=%[9]s

    1. A person approves: the call waits until bob approves it in the web UI.
       bin/arapctl mcp call wire_transfer --arg to=acct-991 --arg amount=50000
    2. Four eyes: one platform approval is not enough; dave and erin together are.
       bin/arapctl mcp call delete_repository --arg repo=acme/legacy-billing
    3. Automated: a rule approves deployments inside the change window.
       bin/arapctl mcp call deploy_service --arg service=billing --arg version=1.4.2
       bin/arapctl attributes set change_freeze true    (a freeze: now it is denied)
    4. Denied: carol denies this one in the web UI; the tool never runs.
       bin/arapctl mcp call wire_transfer --arg to=acct-666 --arg amount=30000
    5. Input: the approvers need a justification, asked for before the request is made.
       bin/arapctl mcp call read_customer_record --arg customer_id=c-42
       bin/arapctl mcp call read_customer_record --arg customer_id=c-42 --input business_justification='Renewal review for ACME'

Started %[7]s. Ctrl-C stops.
`, url, policy, dataDir, PEPToken, ResolverToken, ITSMToken, time.Now().Format(time.RFC3339), mcpURL, AgentToken, Agent2Token, Password, BobAgentToken, dbURL, dbHint,
		passkeyHint(url), os.Getpid(), AdminToken)
}
