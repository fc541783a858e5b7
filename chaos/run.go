// Package chaos is the fault-injection run of arap and its history checker:
// real processes (PostgreSQL, two `arapd serve`, two `arapd mcp`, an
// upstream MCP server) under a load of callers and approvers, while a
// seeded scheduler kills processes, restarts PostgreSQL and breaks the
// network between every pair of parts (toxiproxy, in process), and armed
// fault points kill the processes inside the narrow windows of
// at-most-once. After the faults stop and the system settles, Check judges
// the history: the clients' records, the upstream's side effects and the
// tables.
package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/omcp/arap/mcp/tasks"
)

// Options configure a run.
type Options struct {
	Faults   int           // faults the scheduler injects
	Duration time.Duration // the fault phase
	Seed     int64
	Callers  int
	// PointP arms every fault point with this probability (0: none).
	PointP float64
	// RequestTTL is how long a backend request waits for a decision (so a
	// request left alone expires within the run).
	RequestTTL  time.Duration
	ExecTimeout time.Duration
	// JobTimeout is arapd serve --job-timeout: a delivery whose worker was
	// killed is retried after twice this.
	JobTimeout time.Duration
	// SettleBound is how long the system has, after the faults stop, to
	// bring every task and request to a terminal state.
	SettleBound time.Duration
	// Failover (FailoverSync, FailoverAsync) runs PostgreSQL as a primary
	// with a streaming standby; its PostgreSQL faults are failovers, and
	// Failovers more are scheduled.
	Failover  string
	Failovers int
	// ReplicationLatency delays WAL on its way to the standby (a standby in
	// another zone): what an asynchronous failover can lose.
	ReplicationLatency time.Duration
	Bin                string // arapd/arapctl directory; empty builds them
	Keep               bool   // keep the work directory
	HistoryFile        string // write the history as JSON here
	Log                io.Writer

	jitterMu sync.Mutex
	jitterR  *rand.Rand
}

func (o *Options) jitter(n int) int {
	o.jitterMu.Lock()
	defer o.jitterMu.Unlock()
	if o.jitterR == nil {
		o.jitterR = rand.New(rand.NewPCG(uint64(o.Seed), 99))
	}
	return o.jitterR.IntN(n)
}

// Result is a run's outcome.
type Result struct {
	History    *History
	Violations []Violation
	PointHits  map[string]int
	Elapsed    time.Duration
	// Failover runs: each failover's timings, and the processes whose
	// /readyz did not answer 200 after the settle (each must have found
	// the new primary by itself).
	Failovers []FailoverStat
	NotReady  []string
}

// Run starts the system, runs the load under faults, settles, snapshots and
// checks.
func Run(ctx context.Context, o *Options) (*Result, error) {
	if o.Log == nil {
		o.Log = io.Discard
	}
	t0 := time.Now()
	events := &eventLog{}
	s, err := startSystem(ctx, o, o.Log, events)
	if err != nil {
		return nil, err
	}
	defer s.stop()

	var procs []string
	for _, p := range s.procs {
		procs = append(procs, p.name)
	}
	plans := schedule(o.Seed, o.Faults, o.Duration, procs, s.px.list())
	if o.Failover != "" {
		plans = withFailovers(plans, o.Failovers, o.Duration)
	}

	httpc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 5 * time.Second}}
	stopNew, settled := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var calls []*Call
	var wg sync.WaitGroup
	for i, tok := range s.creds.Callers {
		c := &caller{i: i, token: tok, rng: rand.New(rand.NewPCG(uint64(o.Seed), uint64(i))), stopNew: stopNew,
			record: func(c *Call) { mu.Lock(); calls = append(calls, c); mu.Unlock() }}
		for _, u := range s.mcpURLs {
			c.clients = append(c.clients, &tasks.Client{URL: u, Token: tok, HTTP: httpc})
		}
		wg.Add(1)
		go func() { defer wg.Done(); c.run(ctx, settled) }()
	}
	ap := &approver{s: s, rng: rand.New(rand.NewPCG(uint64(o.Seed), 1000)), planned: map[string]string{}, revokeAt: map[string]time.Time{},
		events: events, http: &http.Client{Timeout: 10 * time.Second}}
	apStop := make(chan struct{})
	apDone := make(chan struct{})
	go func() { defer close(apDone); ap.run(ctx, apStop) }()

	fmt.Fprintf(o.Log, "fault phase: %d faults over %s (seed %d), %d callers, fault points armed at %g\n", o.Faults, o.Duration, o.Seed, o.Callers, o.PointP)
	s.inject(ctx, plans, o.Seed)
	// Quiet: no new faults, heal the network; the armed points stay armed
	// until the processes are restarted without them.
	s.px.healAll()
	close(stopNew)
	fmt.Fprintln(o.Log, "faults stopped; disarming fault points and settling")
	s.disarm()
	settleStart := time.Now()
	h := &History{Settle: SettleOutcome{Bound: o.SettleBound}}
	deadline := settleStart.Add(o.SettleBound)
	for {
		live, pending, err := s.liveCount(ctx, deadline)
		if err == nil && live == 0 && pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	h.Settle.Took = time.Since(settleStart)
	close(settled)
	close(apStop)
	<-apDone
	wg.Wait()
	// Give in-flight deliveries a moment to be recorded before the snapshot.
	if err := s.snapshot(ctx, h); err != nil {
		return nil, err
	}
	for _, t := range h.Tasks {
		if !terminalTask[t.Status] {
			h.Settle.Unsettled = append(h.Settle.Unsettled, t.ID)
		}
	}
	mu.Lock()
	h.Calls = calls
	mu.Unlock()
	sort.Slice(h.Calls, func(i, j int) bool { return h.Calls[i].Start.Before(h.Calls[j].Start) })
	events.mu.Lock()
	h.Faults, h.Decisions = append([]Fault(nil), events.faults...), append([]Decision(nil), events.decisions...)
	events.mu.Unlock()
	h.Executions = s.up.executions()
	r := &Result{History: h, Violations: Check(h), PointHits: s.pointHits(), Elapsed: time.Since(t0)}
	if s.pair != nil {
		r.Failovers = s.pair.statsCopy()
		r.NotReady = s.notReady(ctx)
	}
	if o.HistoryFile != "" {
		b, _ := json.MarshalIndent(struct {
			*History
			Violations []Violation `json:"violations"`
		}{h, r.Violations}, "", " ")
		_ = os.WriteFile(o.HistoryFile, b, 0o600)
	}
	return r, nil
}

// disarm restarts every process without armed fault points, so the settle
// phase is not itself under fire.
func (s *system) disarm() {
	for _, p := range s.procs {
		p.mu.Lock()
		for i, e := range p.env {
			if name, _, ok := strings.Cut(e, "="); ok && (name == "ARAP_FAULT" || name == "ARAP_FAULT_HOLD") {
				p.env[i] = name + "="
			}
		}
		cur := p.cur
		p.mu.Unlock()
		if cur != nil {
			cur.Stop() // SIGTERM; the supervisor restarts it disarmed
		}
	}
}
