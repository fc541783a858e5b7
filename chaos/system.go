package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/bench"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/internal/fault"
	"github.com/omcp/arap/internal/mailsink"
	"github.com/omcp/arap/internal/pgembed"
)

var jsonUnmarshal = json.Unmarshal

// system is the topology under fire: PostgreSQL (durable, fixed port), two
// `arapd serve` and two `arapd mcp`, each process's database connection
// through its own proxy, each front-end to its backend, to its upstream and
// (callbacks) from the backends through proxies, and the callers to each
// front-end through proxies.
type system struct {
	o        *Options
	dir, bin string
	log      io.Writer

	pgMu    sync.Mutex
	pgPort  int
	cluster *pgembed.Cluster // the primary
	pair    *pgPair          // with Options.Failover: the primary and its standby
	db      *pgxpool.Pool    // the chaos process's own, direct (approvers, snapshots)

	px       *proxies
	lb       *balancer
	up       *upstream
	mail     *mailsink.Sink // the SMTP server notifications go to
	creds    *bench.Credentials
	procs    []*proc
	mcpURLs  []string // client -> front-end proxies
	backends []string // direct backend URLs (approvers)

	hitsMu sync.Mutex
	hits   map[string]int // fault point -> kills reported on stderr
	events *eventLog
}

// chaosPolicy is the dev seed policy with short request expiry (a request
// left alone expires within the run) plus the upstream's rules: pay needs
// one ITSM approval, note is allowed; forbidden matches no rule (denied).
func chaosPolicy(ttl time.Duration) []byte {
	p := strings.Replace(string(dev.SeedPolicy()), "request_ttl: 24h", fmt.Sprintf("request_ttl: %ds", int(ttl.Seconds())), 1)
	return []byte(p + `
  - name: chaos_pay
    description: The chaos upstream's pay needs one ITSM approval.
    match: {action: tools/call, resource_type: mcp_tool}
    when: resource.properties.upstream == "` + upstreamName + `" && resource.properties.upstream_tool == "` + ToolPay + `"
    effect: request
    template: chaos_pay
    display:
      title: Chaos payment
      description: A payment of the chaos run.
    approval:
      quorum: 1
      kinds: [itsm]
      approved_for: 10m
  - name: chaos_note
    description: The chaos upstream's note is allowed.
    match: {action: tools/call, resource_type: mcp_tool}
    when: resource.properties.upstream == "` + upstreamName + `" && resource.properties.upstream_tool == "` + ToolNote + `"
    effect: allow
`)
}

func startSystem(ctx context.Context, o *Options, log io.Writer, events *eventLog) (*system, error) {
	s := &system{o: o, log: log, hits: map[string]int{}, events: events, px: newProxies()}
	var err error
	if s.dir, err = os.MkdirTemp("", "arapchaos-"); err != nil {
		return nil, err
	}
	_ = os.Chmod(s.dir, 0o711)
	if err := s.start(ctx); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

func (s *system) start(ctx context.Context) error {
	o := s.o
	s.bin = o.Bin
	if s.bin == "" {
		var err error
		if s.bin, err = bench.Build(ctx, filepath.Join(s.dir, "bin"), s.log); err != nil {
			return err
		}
	}
	var err error
	if s.up, err = startUpstream(); err != nil {
		return err
	}
	if o.Failover != "" {
		fmt.Fprintf(s.log, "starting PostgreSQL (durable): a primary and a streaming standby (%s replication)\n", o.Failover)
		if err := os.MkdirAll(s.holdDir(), 0o700); err != nil {
			return err
		}
		if err := s.startPair(ctx); err != nil {
			return err
		}
	} else {
		fmt.Fprintln(s.log, "starting PostgreSQL (durable)")
		if err := s.pgStart(ctx); err != nil {
			return err
		}
	}
	dbURL, db, err := bench.Database(ctx, s.cluster)
	s.db = db // closed by stop, even on an error
	if err != nil {
		return err
	}
	if s.pair != nil {
		// Every client of the database lists both nodes and finds the
		// writable one by itself, as after a failover it must.
		db.Close()
		dbURL = s.pair.url(func(n *pgNode) string { return fmt.Sprintf("127.0.0.1:%d", n.port) })
		if s.db, err = pgxpool.New(ctx, dbURL); err != nil {
			return err
		}
	}
	env := bench.Env(dbURL)
	if s.creds, err = bench.Provision(ctx, s.bin, env, s.db, o.Callers, "chaos"); err != nil {
		return err
	}
	// A treasury member with an e-mail address, so that wire_transfer
	// requests notify someone (through a real SMTP server) and the
	// notifications' window (notify.after-send) is under fire too.
	for _, args := range [][]string{{"users", "create", "--name", "bob", "--email", "bob@chaos.example"},
		{"groups", "create", "treasury"}, {"groups", "add", "treasury", "bob"}} {
		cmd := exec.CommandContext(ctx, filepath.Join(s.bin, "arapctl"), args...)
		cmd.Env = append(os.Environ(), env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("chaos: arapctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	if s.mail, err = mailsink.Start(mailsink.Options{}); err != nil {
		return err
	}
	policy := filepath.Join(s.dir, "policy.yaml")
	if err := os.WriteFile(policy, chaosPolicy(o.RequestTTL), 0o600); err != nil {
		return err
	}
	pgAddr := fmt.Sprintf("127.0.0.1:%d", s.pgPort)
	dbVia := func(name string) (string, error) {
		if s.pair != nil {
			// A proxy to each node.
			via := map[string]string{}
			for _, n := range s.pair.nodes {
				a, err := s.px.add("db:"+name+":"+n.name, fmt.Sprintf("127.0.0.1:%d", n.port))
				if err != nil {
					return "", err
				}
				via[n.name] = a
			}
			return s.pair.url(func(n *pgNode) string { return via[n.name] }), nil
		}
		a, err := s.px.add("db:"+name, pgAddr)
		return fmt.Sprintf("postgres://postgres@%s/arap?sslmode=disable&connect_timeout=5", a), err
	}
	// Every point at PointP. Windows a run passes less often get more, so
	// each is hit many times per run: a cancellation (the only
	// single-request transition a run makes often) ten times that, and the
	// execution claim's two windows, the narrowest for at-most-once (one
	// pass per approved call), three times.
	armed := fmt.Sprintf("*@%g,requests.after-transition-commit@%g,pep.after-claim@%g,pep.after-invoke@%g",
		o.PointP, min(1, 10*o.PointP), min(1, 3*o.PointP), min(1, 3*o.PointP))
	if o.PointP <= 0 {
		armed = ""
	}
	// Replicas of one deployment share one public URL (the issuer of
	// approval states, the audience of binding tokens, the base the
	// front-ends accept status and cancel URLs under): a load balancer in
	// this process, reached by both front-ends through one proxy.
	if s.lb, err = startBalancer(); err != nil {
		return err
	}
	front, err := s.px.add("backend", s.lb.addr)
	if err != nil {
		return err
	}
	public := "http://" + front
	// slot is a process's address and its database URL (through its proxy).
	slot := func(name string) (addr, url string, err error) {
		if addr, err = bench.FreeAddr(); err != nil {
			return "", "", err
		}
		url, err = dbVia(name)
		return addr, url, err
	}
	for i := 1; i <= 2; i++ {
		name := fmt.Sprintf("serve-%d", i)
		addr, url, err := slot(name)
		if err != nil {
			return err
		}
		s.backends = append(s.backends, "http://"+addr)
		s.lb.add("http://" + addr)
		s.procs = append(s.procs, &proc{s: s, name: name, addr: addr,
			env: []string{"DATABASE_URL=" + url, env[1], "ARAP_FAULT=" + armed},
			args: []string{"serve", "--policy", policy, "--log-level", "warn", "--rate-limit", "100000000", "--public-url", public,
				"--job-timeout", o.JobTimeout.String(), "--smtp-url", "smtp+insecure://" + s.mail.Addr(), "--mail-from", "arap@chaos.example"}})
	}
	for i := 1; i <= 2; i++ {
		name := fmt.Sprintf("mcp-%d", i)
		addr, url, err := slot(name)
		if err != nil {
			return err
		}
		up, err := s.px.add(fmt.Sprintf("upstream:%d", i), s.up.addr)
		if err != nil {
			return err
		}
		cb, err := s.px.add(fmt.Sprintf("callback:%d", i), addr)
		if err != nil {
			return err
		}
		client, err := s.px.add(fmt.Sprintf("client:%d", i), addr)
		if err != nil {
			return err
		}
		s.mcpURLs = append(s.mcpURLs, "http://"+client+"/mcp")
		upstreams := filepath.Join(s.dir, name+"-upstreams.yaml")
		if err := os.WriteFile(upstreams, []byte("upstreams:\n  - name: "+upstreamName+"\n    http: {url: http://"+up+"/mcp}\n    prefix: "+upstreamPfx+"\n"), 0o600); err != nil {
			return err
		}
		s.procs = append(s.procs, &proc{s: s, name: name, addr: addr,
			env: append([]string{"DATABASE_URL=" + url, env[2], "ARAP_FAULT=" + armed,
				"ARAP_BACKEND_TOKEN=" + s.creds.PEPToken, "ARAP_WEBHOOK_SECRETS=" + s.creds.WebhookSecret,
				"ARAP_EXEC_TIMEOUT=" + o.ExecTimeout.String(), "ARAP_INTENT_GRACE=3s"}, s.holdEnv()...),
			args: []string{"mcp", "--backend-url", public, "--public-url", "http://" + cb,
				"--log-level", "warn", "--poll-interval", "1s", "--reconcile-every", "2s", "--upstreams", upstreams, "--demo-tools"}})
	}
	fmt.Fprintln(s.log, "starting 2 x arapd serve, 2 x arapd mcp")
	for _, p := range s.procs {
		if err := p.startOnce(); err != nil {
			return err
		}
	}
	for _, p := range s.procs {
		go p.supervise()
	}
	return nil
}

func (s *system) pgStart(ctx context.Context) error {
	o := pgembed.Options{DataDir: filepath.Join(s.dir, "pg"), Port: s.pgPort}
	if s.pgPort == 0 {
		o.Port = -1
	}
	c, err := pgembed.Start(ctx, o)
	if err != nil {
		return err
	}
	s.cluster = c
	if s.pgPort == 0 {
		cs := c.ConnString("x")
		_, _ = fmt.Sscanf(cs[strings.LastIndex(cs, ":")+1:], "%d", &s.pgPort)
	}
	return nil
}

// freePort is a loopback port free now.
func freePort() (int, error) {
	a, err := bench.FreeAddr()
	if err != nil {
		return 0, err
	}
	var port int
	_, err = fmt.Sscanf(a[strings.LastIndex(a, ":")+1:], "%d", &port)
	return port, err
}

// pgFault stops PostgreSQL (fast: sessions disconnected, a checkpoint; or
// immediate: a crash, recovered from the WAL at the next start), waits, and
// starts it again on the same port.
func (s *system) pgFault(ctx context.Context, immediate bool, down time.Duration) error {
	s.pgMu.Lock()
	defer s.pgMu.Unlock()
	stop := s.cluster.Stop
	if immediate {
		stop = s.cluster.StopImmediate
	}
	_ = stop(ctx)
	select {
	case <-ctx.Done():
	case <-time.After(down):
	}
	var err error
	for range 5 {
		if err = s.pgStart(context.Background()); err == nil {
			return nil
		}
		time.Sleep(time.Second)
	}
	return err
}

func (s *system) hit(name string) {
	s.hitsMu.Lock()
	s.hits[name]++
	s.hitsMu.Unlock()
}

func (s *system) pointHits() map[string]int {
	s.hitsMu.Lock()
	defer s.hitsMu.Unlock()
	out := map[string]int{}
	for _, n := range fault.Names {
		out[n] = s.hits[n]
	}
	return out
}

func (s *system) stop() {
	for _, p := range s.procs {
		p.halt()
	}
	if s.px != nil {
		s.px.stop()
	}
	if s.up != nil {
		s.up.close()
	}
	if s.lb != nil {
		s.lb.close()
	}
	if s.mail != nil {
		_ = s.mail.Close()
	}
	if s.db != nil {
		s.db.Close()
	}
	if s.pair != nil {
		s.pair.stop()
	} else if s.cluster != nil {
		_ = s.cluster.Stop(context.Background())
	}
	if !s.o.Keep {
		_ = os.RemoveAll(s.dir)
	}
}

// proc is one arap process under a supervisor: whenever it dies (a kill -9
// of the run, an armed fault point) it is started again on the same address
// after a short delay.
type proc struct {
	s         *system
	name      string
	addr      string
	env, args []string

	mu       sync.Mutex
	cur      *bench.Process
	stopping bool
	restarts int
}

func (p *proc) startOnce() error {
	p.mu.Lock()
	// Each process and each of its lives draws differently, reproducibly.
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s/%d", p.s.o.Seed, p.name, p.restarts)
	seed := fmt.Sprintf("ARAP_FAULT_SEED=%d", h.Sum64()>>1)
	p.mu.Unlock()
	w := &pointWriter{p: p}
	bp, err := bench.StartProcess(filepath.Join(p.s.bin, "arapd"), append(append([]string{}, p.env...), seed), p.addr, w, p.args...)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.cur = bp
	p.mu.Unlock()
	return nil
}

func (p *proc) supervise() {
	for {
		p.mu.Lock()
		cur := p.cur
		p.mu.Unlock()
		if cur != nil {
			<-cur.Done()
		}
		p.mu.Lock()
		if p.stopping {
			p.mu.Unlock()
			return
		}
		p.cur = nil
		p.restarts++
		p.mu.Unlock()
		time.Sleep(time.Duration(100+p.s.o.jitter(400)) * time.Millisecond)
		if err := p.startOnce(); err != nil {
			// PostgreSQL down or the port held: try again shortly.
			time.Sleep(500 * time.Millisecond)
		}
	}
}

// kill sends SIGKILL to the running process, if one runs.
func (p *proc) kill() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil {
		return false
	}
	p.cur.Kill()
	return true
}

func (p *proc) halt() {
	p.mu.Lock()
	p.stopping = true
	cur := p.cur
	p.mu.Unlock()
	if cur != nil {
		cur.Stop()
	}
}

// pointWriter counts the fault points a process reports before it kills
// itself ("arap-fault: NAME" on stderr).
type pointWriter struct {
	p   *proc
	buf []byte
}

func (w *pointWriter) Write(b []byte) (int, error) {
	w.buf = append(w.buf, b...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			break
		}
		line := string(w.buf[:i])
		w.buf = w.buf[i+1:]
		if name, ok := strings.CutPrefix(line, fault.Prefix); ok {
			w.p.s.hit(name)
			w.p.s.events.fault("point:"+name, w.p.name, time.Now(), time.Now().Add(2*time.Second))
		}
		if rest, ok := strings.CutPrefix(line, fault.HoldPrefix); ok && w.p.s.pair != nil {
			if name, token, ok := strings.Cut(rest, " "); ok {
				go w.p.s.pair.held(context.Background(), name, token)
			}
		}
	}
	if len(w.buf) > 64<<10 {
		w.buf = w.buf[:0]
	}
	return len(b), nil
}

var _ = bufio.NewScanner
