package bench

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/internal/pgembed"
	"github.com/omcp/arap/pep"
)

// System is arap started for a benchmark: a private PostgreSQL, `arapd
// serve` and `arapd mcp` as processes, API clients and MCP callers.
type System struct {
	DB         *pgxpool.Pool
	DBURL      string
	BackendURL string
	MCPURL     string // the MCP endpoint
	// UpstreamURL is the go-sdk's conformance everything-server, which
	// arapd mcp also offers as the upstream "everything" (prefix up_).
	UpstreamURL string
	PEPToken    string
	ITSMToken   string
	Callers     []string // MCP caller tokens, one principal each
	Serve, MCP  *Process
	upstream    *exec.Cmd
	cluster     *pgembed.Cluster
	dir         string
	clients     sync.Map // token -> *tasks.Client (mcpClient)
}

// Options configure Start.
type Options struct {
	// Bin holds arapd and arapctl; empty builds them from this module.
	Bin string
	// Callers is how many MCP principals to create (per-caller limits bound
	// each principal's live tasks, so the gate load is spread over many).
	Callers int
	// Pprof serves profiles of arapd serve on 127.0.0.1:6060 and of arapd
	// mcp on 127.0.0.1:6061 (ARAP_PPROF_ADDR).
	Pprof bool
	// Statements loads pg_stat_statements into the cluster, for
	// Config.Statements.
	Statements bool
	Log        io.Writer
}

// Start brings a system up. Stop takes it down.
func Start(ctx context.Context, o Options) (*System, error) {
	s := &System{}
	var err error
	if s.dir, err = os.MkdirTemp("", "arapbench-"); err != nil {
		return nil, err
	}
	_ = os.Chmod(s.dir, 0o711) // the PostgreSQL account must reach its cluster when we are root
	if err := s.start(ctx, o); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

func (s *System) start(ctx context.Context, o Options) error {
	if o.Log == nil {
		o.Log = io.Discard
	}
	bin := o.Bin
	if bin == "" {
		var err error
		if bin, err = Build(ctx, filepath.Join(s.dir, "bin"), o.Log); err != nil {
			return err
		}
	}
	fmt.Fprintln(o.Log, "starting the upstream MCP server")
	if err := s.startUpstream(filepath.Join(bin, everythingServer)); err != nil {
		return err
	}
	fmt.Fprintln(o.Log, "starting PostgreSQL")
	var err error
	pgo := pgembed.Options{DataDir: filepath.Join(s.dir, "pg")}
	if o.Statements {
		pgo.Settings = []string{"shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track=all"}
	}
	if s.cluster, err = pgembed.Start(ctx, pgo); err != nil {
		return err
	}
	if s.DBURL, s.DB, err = Database(ctx, s.cluster); err != nil {
		return err
	}
	if o.Statements {
		if _, err := s.DB.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
			return err
		}
	}
	fmt.Fprintf(o.Log, "database %s\n", s.DBURL)
	env := Env(s.DBURL)
	creds, err := Provision(ctx, bin, env, s.DB, max(o.Callers, 1), "bench")
	if err != nil {
		return err
	}
	s.PEPToken, s.ITSMToken, s.Callers = creds.PEPToken, creds.ITSMToken, creds.Callers
	secret := creds.WebhookSecret
	policy := filepath.Join(s.dir, "policy.yaml")
	if err := os.WriteFile(policy, append(dev.SeedPolicy(), upstreamRule...), 0o600); err != nil {
		return err
	}
	upstreams := filepath.Join(s.dir, "upstreams.yaml")
	if err := os.WriteFile(upstreams, []byte("upstreams:\n  - name: everything\n    http: {url: "+s.UpstreamURL+"}\n    prefix: up_\n"), 0o600); err != nil {
		return err
	}
	fmt.Fprintln(o.Log, "starting arapd serve and arapd mcp")
	serveEnv, mcpEnv := env, append(env, "ARAP_BACKEND_TOKEN="+s.PEPToken, "ARAP_WEBHOOK_SECRETS="+secret)
	if o.Pprof {
		serveEnv = append(slices.Clone(serveEnv), "ARAP_PPROF_ADDR=127.0.0.1:6060")
		mcpEnv = append(mcpEnv, "ARAP_PPROF_ADDR=127.0.0.1:6061")
	}
	if s.Serve, err = startProcess(filepath.Join(bin, "arapd"), serveEnv,
		"serve", "--policy", policy, "--log-level", "warn", "--rate-limit", "100000000"); err != nil {
		return err
	}
	s.BackendURL = "http://" + s.Serve.Addr
	if s.MCP, err = startProcess(filepath.Join(bin, "arapd"), mcpEnv,
		"mcp", "--backend-url", s.BackendURL, "--log-level", "warn", "--poll-interval", "1s", "--upstreams", upstreams, "--demo-tools"); err != nil {
		return err
	}
	s.MCPURL = "http://" + s.MCP.Addr + "/mcp"
	return nil
}

// Build builds arapd, arapctl and the go-sdk everything-server into dir
// and returns dir.
func Build(ctx context.Context, dir string, log io.Writer) (string, error) {
	for cmd, pkg := range map[string]string{"arapd": "github.com/omcp/arap/cmd/arapd", "arapctl": "github.com/omcp/arap/cmd/arapctl", everythingServer: everythingPackage} {
		fmt.Fprintf(log, "building %s\n", cmd)
		if out, err := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, cmd), pkg).CombinedOutput(); err != nil {
			return "", fmt.Errorf("bench: build %s (run inside the module, or pass --bin): %v\n%s", cmd, err, out)
		}
	}
	return dir, nil
}

// Credentials are what Provision made: the PEP's API client token and
// webhook secret, an ITSM resolver's token, and MCP caller tokens.
type Credentials struct {
	PEPToken, ITSMToken, WebhookSecret string
	Callers                            []string // one principal each
}

// Provision migrates the database env names (DATABASE_URL and master keys)
// and creates, with the arapctl in bin, the API clients a system needs: the
// PEP (evaluate, request; loopback callbacks) and an ITSM resolver (decide),
// plus n MCP callers named <prefix>-<i>, subject user<i>, actor agent:<prefix>.
func Provision(ctx context.Context, bin string, env []string, db *pgxpool.Pool, n int, prefix string) (*Credentials, error) {
	run := func(name string, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, filepath.Join(bin, name), args...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("bench: %s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out), nil
	}
	if _, err := run("arapd", "migrate"); err != nil {
		return nil, err
	}
	c := &Credentials{}
	token := regexp.MustCompile(`token: (\S+)`)
	out, err := run("arapctl", "clients", "create", "--name", "pep", "--scope", "evaluate,request", "--actor", "agent:*",
		"--callback-prefix", "http://127.0.0.1:", "--callback-network", "loopback")
	if err != nil {
		return nil, err
	}
	c.PEPToken = token.FindStringSubmatch(out)[1]
	if out, err = run("arapctl", "clients", "create", "--name", "itsm", "--scope", "decide", "--kind", "itsm"); err != nil {
		return nil, err
	}
	c.ITSMToken = token.FindStringSubmatch(out)[1]
	if out, err = run("arapctl", "clients", "secret", "rotate", "pep"); err != nil {
		return nil, err
	}
	c.WebhookSecret = regexp.MustCompile(`(whsec_\S+)`).FindStringSubmatch(out)[1]
	callers := &pep.Callers{DB: db}
	for i := range n {
		tok := fmt.Sprintf("%s-caller-%05d-%s", prefix, i, randomKey()[:12])
		if err := callers.Create(ctx, fmt.Sprintf("%s-%d", prefix, i), tok, pep.Principal{SubjectType: "user", SubjectID: fmt.Sprintf("user%d", i), ActorID: "agent:" + prefix}); err != nil {
			return nil, err
		}
		c.Callers = append(c.Callers, tok)
	}
	return c, nil
}

// The upstream of the allowed-call overhead: the go-sdk's conformance
// everything-server (built from third_party/go-sdk), whose simplest tool the
// dev policy plus upstreamRule allows.
const (
	everythingServer  = "everything-server"
	everythingPackage = "github.com/modelcontextprotocol/go-sdk/conformance/everything-server"
	UpstreamTool      = "test_simple_text"
)

var upstreamRule = []byte(`
  - name: bench_upstream
    description: The benchmark's upstream tool is always allowed.
    match: {action: tools/call, resource_type: mcp_tool}
    when: resource.properties.upstream == "everything" && resource.properties.upstream_tool == "` + UpstreamTool + `"
    effect: allow
`)

// startUpstream runs the everything-server on streamable HTTP (stateless)
// on a free loopback port and waits until it accepts connections.
func (s *System) startUpstream(bin string) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := ln.Addr().String()
	ln.Close()
	s.upstream = exec.Command(bin, "-http", addr)
	if err := s.upstream.Start(); err != nil {
		return err
	}
	s.UpstreamURL = "http://" + addr + "/mcp"
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return nil
		}
	}
	return errors.New("bench: the upstream MCP server did not start within 30s")
}

// Stop ends the processes and the cluster and removes everything.
func (s *System) Stop() {
	for _, p := range []*Process{s.MCP, s.Serve} {
		if p != nil {
			p.Stop()
		}
	}
	if s.upstream != nil && s.upstream.Process != nil {
		_ = s.upstream.Process.Kill()
		_ = s.upstream.Wait()
	}
	if s.DB != nil {
		s.DB.Close()
	}
	if s.cluster != nil {
		_ = s.cluster.Stop(context.Background())
	}
	_ = os.RemoveAll(s.dir)
}

// Database creates database arap on cluster and returns its URL and a pool
// on it.
func Database(ctx context.Context, cluster *pgembed.Cluster) (string, *pgxpool.Pool, error) {
	conn, err := pgx.Connect(ctx, cluster.ConnString("postgres"))
	if err != nil {
		return "", nil, err
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE arap")
	conn.Close(ctx)
	if err != nil {
		return "", nil, err
	}
	url := cluster.ConnString("arap")
	pool, err := pgxpool.New(ctx, url)
	return url, pool, err
}

// Env is the environment arapd and arapctl need on database url: the URL
// and fresh master keys for both processes, in that order.
func Env(url string) []string {
	return []string{"DATABASE_URL=" + url, "ARAP_MASTER_KEY=" + randomKey(), "ARAP_PEP_MASTER_KEY=" + randomKey()}
}

func randomKey() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.StdEncoding.EncodeToString(b)
}

// Process is a server process of the system.
type Process struct {
	Addr string
	cmd  *exec.Cmd
	done chan struct{}
}

// startProcess runs `bin args... --addr 127.0.0.1:<free port>` and waits
// until its /healthz answers.
func startProcess(bin string, env []string, args ...string) (*Process, error) {
	return StartProcess(bin, env, "", nil, args...)
}

// FreeAddr is a loopback address with a port free now.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// StartProcess runs `bin args... --addr addr` (a free loopback port when
// addr is empty) and waits until its /healthz answers. stderr, when not
// nil, also receives the process's standard error.
func StartProcess(bin string, env []string, addr string, stderr io.Writer, args ...string) (*Process, error) {
	if addr == "" {
		var err error
		if addr, err = FreeAddr(); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command(bin, append(args, "--addr", addr)...)
	cmd.Env = append(os.Environ(), env...)
	var logs strings.Builder
	cmd.Stderr = &limitedWriter{w: &logs, n: 64 << 10}
	if stderr != nil {
		cmd.Stderr = io.MultiWriter(cmd.Stderr, stderr)
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{Addr: addr, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(60 * time.Second)
	// The servers log at warn (bench load would drown in info lines), so
	// readiness is /healthz, each probe bounded.
	probe := &http.Client{Timeout: 2 * time.Second}
	for {
		resp, err := probe.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, nil
			}
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("bench: %s %s exited before it was ready: %s", bin, args[0], logs.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, errors.New("bench: " + args[0] + " did not start within 60s")
		}
	}
}

type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(b []byte) (int, error) {
	if l.n > 0 {
		k := min(len(b), l.n)
		l.n -= k
		_, _ = l.w.Write(b[:k])
	}
	return len(b), nil
}

// PeakRSS is the process's peak resident set size in bytes (VmHWM).
func (p *Process) PeakRSS() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, errors.New("bench: no VmHWM in /proc status")
}

// Kill sends SIGKILL, as kill -9 would; Done closes when it has exited.
func (p *Process) Kill() { _ = p.cmd.Process.Kill() }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Stop ends the process (SIGTERM, then SIGKILL after 10s).
func (p *Process) Stop() {
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}
