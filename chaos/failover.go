package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/omcp/arap/internal/pgembed"
)

// Failover modes (Options.Failover): PostgreSQL is a primary with one
// streaming standby, and the PostgreSQL faults are failovers: kill -9 of
// the primary, pg_ctl promote of the standby, the old primary rebuilt as
// the new one's standby. Sync makes the standby synchronous
// (synchronous_standby_names, synchronous_commit on): a commit is on both
// before it is acknowledged. Async streams without waiting: a failover
// loses what the standby had not received.
const (
	FailoverSync  = "sync"
	FailoverAsync = "async"
)

// FaultFailover is a failover (Fault.Kind); its Target says where it
// struck: "postgresql" at a random moment, "postgresql@<point>" while a
// front-end was held at that fault point (inside the claim window).
const FaultFailover = "pg-failover"

// holdPoints are where a front-end is held, with this probability, so a
// failover can strike inside the execution claim's window: the claim
// committed and the tool not run yet, or the tool run and its outcome not
// recorded.
var holdPoints = []string{"pep.after-claim", "pep.after-invoke"}

const holdP = 0.5

// pgNode is one PostgreSQL server of the pair: its name (application_name
// as a standby), port and data directory stay; its role changes.
type pgNode struct {
	name string
	port int
	dir  string
	c    *pgembed.Cluster
	repl string // the replication link to this node (a proxy adding latency)
}

// pgPair is the primary and its standby.
type pgPair struct {
	s       *system
	mode    string
	mu      sync.Mutex // held for a whole failover
	sched   sync.Mutex // one scheduled failover offered at a time
	nodes   [2]*pgNode
	primary int
	repl    *proxies // the replication links, outside the network faults' reach

	// want hands a due failover to the first front-end held at a fault
	// point; the scheduler takes it back if none comes.
	want chan *failoverReq

	statsMu sync.Mutex
	stats   []FailoverStat
}

type failoverReq struct{ done chan string }

// FailoverStat is one failover's timings.
type FailoverStat struct {
	Where    string        `json:"where"`    // "random" or the fault point a front-end was held at
	Promoted time.Duration `json:"promoted"` // kill -9 of the primary to the standby accepting writes
	Rebuilt  time.Duration `json:"rebuilt"`  // kill -9 to a new standby streaming (synchronous in sync mode)
}

func (s *system) startPair(ctx context.Context) error {
	o := s.o
	pp := &pgPair{s: s, mode: o.Failover, repl: newProxies(), want: make(chan *failoverReq, 1)}
	s.pair = pp
	a, err := pgembed.Start(ctx, pgembed.Options{DataDir: filepath.Join(s.dir, "pg-a"), Port: -1})
	if err != nil {
		return err
	}
	pp.nodes[0] = &pgNode{name: "node_a", port: a.Port(), dir: a.DataDir(), c: a}
	bPort, err := freePort()
	if err != nil {
		return err
	}
	pp.nodes[1] = &pgNode{name: "node_b", port: bPort, dir: filepath.Join(s.dir, "pg-b")}
	for _, n := range pp.nodes {
		if n.repl, err = pp.repl.add("repl:"+n.name, fmt.Sprintf("127.0.0.1:%d", n.port)); err != nil {
			return err
		}
		if err := pp.lag(n); err != nil {
			return err
		}
	}
	s.cluster = a
	s.pgPort = a.Port()
	return pp.startStandby(ctx, pp.nodes[1], pp.nodes[0])
}

// lag puts the replication latency on n's link: WAL flows downstream, from
// the primary to the standby.
func (pp *pgPair) lag(n *pgNode) error {
	if pp.s.o.ReplicationLatency <= 0 {
		return nil
	}
	body := fmt.Sprintf(`{"name":"lag","type":"latency","stream":"downstream","toxicity":1,"attributes":{"latency":%d,"jitter":0}}`,
		pp.s.o.ReplicationLatency.Milliseconds())
	if _, err := pp.repl.byName["repl:"+n.name].Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
		return fmt.Errorf("chaos: replication latency: %w", err)
	}
	return nil
}

// startStandby makes n a standby of primary, streaming through primary's
// replication link.
func (pp *pgPair) startStandby(ctx context.Context, n, primary *pgNode) error {
	if err := os.RemoveAll(n.dir); err != nil {
		return err
	}
	c, err := primary.c.StartStandby(ctx, pgembed.StandbyOptions{Name: n.name, DataDir: n.dir, Port: n.port})
	if err != nil {
		return err
	}
	n.c = c
	// Through the link: the base backup came direct; WAL from now on
	// arrives with the link's latency (PostgreSQL 13 and later reload
	// primary_conninfo without a restart).
	host, port, _ := strings.Cut(primary.repl, ":")
	if err := exec1(ctx, c.ConnString("postgres"),
		fmt.Sprintf("ALTER SYSTEM SET primary_conninfo = 'host=%s port=%s user=postgres sslmode=disable application_name=%s'", host, port, n.name),
		"SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("chaos: standby %s through its link: %w", n.name, err)
	}
	if pp.mode == FailoverSync {
		if err := exec1(ctx, primary.c.ConnString("postgres"),
			fmt.Sprintf("ALTER SYSTEM SET synchronous_standby_names = '%s'", n.name), "SELECT pg_reload_conf()"); err != nil {
			return fmt.Errorf("chaos: synchronous standby %s: %w", n.name, err)
		}
	}
	return waitStreaming(ctx, primary.c.ConnString("postgres"), n.name, primary.repl, pp.mode == FailoverSync)
}

// exec1 runs statements on one connection.
func exec1(ctx context.Context, url string, stmts ...string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, q := range stmts {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}

// waitStreaming waits until the primary streams to the standby called name
// over its link (the connection from the link's proxy), as its synchronous
// standby if sync.
func waitStreaming(ctx context.Context, url, name, link string, sync bool) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	state, syncState := "", ""
	for {
		// A walsender through the link comes from the proxy, on loopback;
		// the base backup's direct one is gone once the reload restarted
		// the receiver, so the newest one is the link's.
		err := conn.QueryRow(ctx, `SELECT coalesce(state, ''), coalesce(sync_state, '') FROM pg_stat_replication
			WHERE application_name = $1 ORDER BY backend_start DESC LIMIT 1`, name).Scan(&state, &syncState)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if state == "streaming" && (!sync || syncState == "sync") {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("standby %s (via %s) not streaming: state %q, sync_state %q: %w", name, link, state, syncState, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// url is a database URL listing both nodes (each at addr(node)), so a
// client finds the writable one by itself.
func (pp *pgPair) url(addr func(n *pgNode) string) string {
	return fmt.Sprintf("postgres://postgres@%s,%s/arap?sslmode=disable&connect_timeout=5&target_session_attrs=read-write",
		addr(pp.nodes[0]), addr(pp.nodes[1]))
}

// failover kills the primary, promotes the standby and rebuilds the old
// primary as the new one's standby. afterKill runs right after the kill
// (the release of a held front-end).
func (pp *pgPair) failover(ctx context.Context, where string, afterKill func()) error {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	old, next := pp.nodes[pp.primary], pp.nodes[1-pp.primary]
	t0 := time.Now()
	// The primary is lost with its network, as in a zone's failure: WAL
	// still on its way to the standby (in the link's latency) is lost too.
	_ = pp.repl.toxic("repl:"+old.name, "cut", "")
	err := old.c.Kill()
	if afterKill != nil {
		afterKill()
	}
	if err != nil {
		return err
	}
	if err := next.c.Promote(ctx); err != nil {
		return err
	}
	pp.repl.heal("repl:" + old.name)
	if err := pp.lag(old); err != nil {
		return err
	}
	promoted := time.Since(t0)
	pp.primary = 1 - pp.primary
	pp.s.pgMu.Lock()
	pp.s.cluster = next.c
	pp.s.pgMu.Unlock()
	if err := pp.startStandby(ctx, old, next); err != nil {
		return err
	}
	pp.statsMu.Lock()
	pp.stats = append(pp.stats, FailoverStat{Where: where, Promoted: promoted, Rebuilt: time.Since(t0)})
	pp.statsMu.Unlock()
	pp.s.events.fault(FaultFailover, "postgresql@"+where, t0, t0.Add(promoted))
	return nil
}

// scheduled runs one failover of the schedule: offered first to a
// front-end held inside the claim window, at a random moment if none
// comes within wait.
func (pp *pgPair) scheduled(ctx context.Context, wait time.Duration) {
	pp.sched.Lock()
	defer pp.sched.Unlock()
	r := &failoverReq{done: make(chan string, 1)}
	select {
	case pp.want <- r:
	case <-ctx.Done():
		return
	}
	select {
	case <-r.done:
		return
	case <-time.After(wait):
	case <-ctx.Done():
	}
	select {
	case <-pp.want: // nobody took it
		if err := pp.failover(ctx, "random", nil); err != nil {
			fmt.Fprintf(pp.s.log, "chaos: failover failed: %v\n", err)
		}
	case <-r.done:
	}
}

// held is a front-end held at a fault point: a due failover strikes now,
// and the front-end is released right after the primary's kill; with none
// due it is released at once.
func (pp *pgPair) held(ctx context.Context, point, token string) {
	release := func() { _ = os.WriteFile(filepath.Join(pp.s.holdDir(), token), nil, 0o600) }
	select {
	case r := <-pp.want:
		if err := pp.failover(ctx, point, release); err != nil {
			fmt.Fprintf(pp.s.log, "chaos: failover failed: %v\n", err)
		}
		r.done <- point
	default:
		release()
	}
}

func (pp *pgPair) statsCopy() []FailoverStat {
	pp.statsMu.Lock()
	defer pp.statsMu.Unlock()
	return append([]FailoverStat(nil), pp.stats...)
}

func (pp *pgPair) stop() {
	pp.repl.stop()
	for _, n := range pp.nodes {
		if n != nil && n.c != nil {
			_ = n.c.Stop(context.Background())
		}
	}
}

// holdEnv arms the hold points of a front-end in a failover run.
func (s *system) holdEnv() []string {
	if s.pair == nil {
		return nil
	}
	var arms []string
	for _, p := range holdPoints {
		arms = append(arms, fmt.Sprintf("%s@%g", p, holdP))
	}
	return []string{"ARAP_FAULT_HOLD=" + strings.Join(arms, ","), "ARAP_FAULT_HOLD_DIR=" + s.holdDir()}
}

func (s *system) holdDir() string { return filepath.Join(s.dir, "holds") }

// notReady names the processes whose /readyz does not answer 200 within
// a minute after the settle: each must have found the new primary by
// itself.
func (s *system) notReady(ctx context.Context) []string {
	var out []string
	client := &http.Client{Timeout: 5 * time.Second}
	for _, p := range s.procs {
		deadline := time.Now().Add(time.Minute)
		for {
			resp, err := client.Get("http://" + p.addr + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				out = append(out, p.name)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return out
}

// FailoverFailures says why a failover run fails, beyond Summary.Failures:
// a process that did not find the new primary, and an outage answered as
// an internal error (clients must see 503 with Retry-After, or the
// retryable JSON-RPC error, while no primary is writable).
func FailoverFailures(r *Result, s *Summary) []string {
	var out []string
	if len(r.NotReady) > 0 {
		out = append(out, "not ready after the settle: "+strings.Join(r.NotReady, ", "))
	}
	if s.Internal > 0 || s.ApproverInternal > 0 {
		out = append(out, fmt.Sprintf("%d internal errors answered to callers and %d to the approver", s.Internal, s.ApproverInternal))
	}
	return out
}

// PrintFailovers writes the failovers' figures.
func PrintFailovers(w io.Writer, r *Result) {
	where := map[string]int{}
	var promoted, rebuilt []time.Duration
	for _, f := range r.Failovers {
		where[f.Where]++
		promoted = append(promoted, f.Promoted)
		rebuilt = append(rebuilt, f.Rebuilt)
	}
	fmt.Fprintf(w, "failovers: %d (%s); kill -9 to promoted: %s; to a new standby streaming: %s\n",
		len(r.Failovers), counts(where), spread(promoted), spread(rebuilt))
	for _, c := range r.History.Calls {
		for _, a := range c.Attempts {
			if a.Outcome == "internal" {
				fmt.Fprintf(w, "INTERNAL %s %s %s: %s\n", a.At.Format("15:04:05.000"), c.ID, a.Method, a.Detail)
			}
		}
	}
}

// spread is "median / max" of ds.
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("median %s, max %s", s[len(s)/2].Round(10*time.Millisecond), s[len(s)-1].Round(10*time.Millisecond))
}
