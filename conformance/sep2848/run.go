// Package sep2848 is a conformance suite for SEP-2848 (MCP tool approval,
// io.modelcontextprotocol/tool-approval): scenarios run against any MCP
// server URL over the 2026-07-28 stateless HTTP transport, each check with
// an id (sep-2848-...) that conformance/sep-2848.yaml traces to the
// normative sentence it tests. Approvals are decided through a Resolver the
// server under test provides.
package sep2848

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Outcome is a check's result.
type Outcome string

const (
	Passed  Outcome = "passed"
	Failed  Outcome = "failed"
	Skipped Outcome = "skipped"
)

// Result is one check's outcome.
type Result struct {
	ID       string  `json:"id"`
	Scenario string  `json:"scenario"`
	Level    string  `json:"level"`
	Outcome  Outcome `json:"outcome"`
	Detail   string  `json:"detail,omitempty"`
}

// Config is a run against one server.
type Config struct {
	URL   string // the MCP endpoint
	Token string // bearer token of the principal the scenarios act as
	// OtherToken is a second principal (access control, dedup scope);
	// without it those checks are skipped.
	OtherToken string
	// LimitsToken is a third principal, spent on the per-caller limits: the
	// limits scenario leaves it at its submission rate for a minute.
	// Without it the limits checks are skipped.
	LimitsToken string
	Profile     Profile
	Resolver    Resolver
	// BackendURL, when known, must never appear in an MCP response.
	BackendURL string
	// Scenarios limits the run to these names (all when empty).
	Scenarios []string
	// Timeout bounds each scenario beyond the waits its profile declares,
	// and how long the server may take to act on something that happened
	// outside it (a backend cancel, a grant provisioning); default 2
	// minutes.
	Timeout time.Duration
	HTTP    *http.Client
	// Log receives a line per scenario and check as they finish.
	Log io.Writer
}

// Run runs the scenarios and returns every registered check's result, in
// registry order: a check a scenario never reached is failed, not missing.
func Run(ctx context.Context, cfg Config) []Result {
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Minute
	}
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Timeout: 60 * time.Second}
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	r := &run{cfg: cfg, p: cfg.Profile, results: map[string]Result{}, calls: map[string]Call{},
		c: &client{url: cfg.URL, token: cfg.Token, exts: tasksOnly, hc: cfg.HTTP, seen: &transcript{}}}
	for _, s := range scenarios {
		if len(cfg.Scenarios) > 0 && !slices.Contains(cfg.Scenarios, s.name) {
			continue
		}
		r.scenario = s.name
		start := time.Now()
		// The bound is on the server's promptness, beyond the waits the
		// profile itself declares (an expiry, a stall, provisioning).
		sctx, cancel := context.WithTimeout(ctx, cfg.Timeout+r.p.waits())
		err := s.run(sctx, r)
		cancel()
		for _, id := range checksOf(s.name) {
			if _, done := r.results[id]; !done {
				if err != nil {
					r.fail(id, "not reached: %v", err)
				} else {
					r.fail(id, "the scenario never evaluated this check")
				}
			}
		}
		fmt.Fprintf(cfg.Log, "scenario %s done in %s\n", s.name, time.Since(start).Round(time.Millisecond))
	}
	var out []Result
	for _, c := range Checks {
		if res, ok := r.results[c.ID]; ok {
			out = append(out, res)
		}
	}
	return out
}

// Summary counts outcomes.
func Summary(rs []Result) (passed, failed, skipped int) {
	for _, r := range rs {
		switch r.Outcome {
		case Passed:
			passed++
		case Failed:
			failed++
		case Skipped:
			skipped++
		}
	}
	return
}

// waits is the longest a scenario may legitimately wait on the profile's
// own timers.
func (p Profile) waits() time.Duration {
	d := time.Duration(p.ExpiresWithin)
	if p.Stalling != nil {
		d += time.Duration(p.Stalling.For)
	}
	for _, x := range []*Delayed{p.Provisioning, p.Outliving, p.Reinput} {
		if x != nil {
			d += time.Duration(x.After) * time.Duration(p.MaxRequests+2)
		}
	}
	return d
}

// run is the state of one run.
type run struct {
	cfg      Config
	p        Profile
	c        *client
	scenario string
	mu       sync.Mutex
	results  map[string]Result
	// calls is the call behind each task the scenarios opened, so the
	// run-wide scans know what client-supplied text each task's
	// model-facing text must not repeat.
	calls map[string]Call
	// poll is the latest pollIntervalMs the server suggested.
	poll atomic.Int64
}

// settle is how long "nothing happens" is watched for: four poll intervals
// of the server under test (as it suggests them), at least a second and at
// most twenty.
func (r *run) settle() time.Duration {
	d := 4 * time.Duration(r.poll.Load()) * time.Millisecond
	return min(max(d, time.Second), 20*time.Second)
}

// opened notes the call behind task id.
func (r *run) opened(id string, call Call) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls[id] = call
}

// callOf returns the call behind task id, if a scenario opened it.
func (r *run) callOf(id string) (Call, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.calls[id]
	return c, ok
}

// saw notes a task's suggested poll interval.
func (r *run) saw(t *task) {
	if t != nil && t.PollIntervalMs > 0 {
		r.poll.Store(int64(t.PollIntervalMs))
	}
}

func (r *run) record(id string, o Outcome, detail string) {
	def, ok := checkByID[id]
	if !ok {
		panic("sep2848: unregistered check " + id)
	}
	if def.Scenario != r.scenario {
		panic("sep2848: check " + id + " belongs to scenario " + def.Scenario + ", not " + r.scenario)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if prev, done := r.results[id]; done && (prev.Outcome == Failed || o != Failed) {
		return // the first failure stands
	}
	r.results[id] = Result{ID: id, Scenario: r.scenario, Level: def.Level, Outcome: o, Detail: detail}
	fmt.Fprintf(r.cfg.Log, "  %-7s %s %s\n", o, id, detail)
}

func (r *run) pass(id string) { r.record(id, Passed, "") }

func (r *run) fail(id, format string, args ...any) {
	r.record(id, Failed, fmt.Sprintf(format, args...))
}

func (r *run) skip(id, why string) { r.record(id, Skipped, why) }

// expect passes id when ok, and fails it with the formatted detail
// otherwise. It returns ok.
func (r *run) expect(id string, ok bool, format string, args ...any) bool {
	if ok {
		r.pass(id)
	} else {
		r.fail(id, format, args...)
	}
	return ok
}

// Check is a registered check.
type Check struct {
	ID       string
	Scenario string
	Level    string // MUST or SHOULD
	What     string
}

var checkByID = func() map[string]Check {
	m := map[string]Check{}
	for _, c := range Checks {
		if _, dup := m[c.ID]; dup {
			panic("sep2848: duplicate check " + c.ID)
		}
		m[c.ID] = c
	}
	return m
}()

func checksOf(scenario string) []string {
	var ids []string
	for _, c := range Checks {
		if c.Scenario == scenario {
			ids = append(ids, c.ID)
		}
	}
	return ids
}

// Scenarios lists the scenario names in run order.
func Scenarios() []string {
	var names []string
	for _, s := range scenarios {
		names = append(names, s.name)
	}
	return names
}

// ScenarioOf returns the scenario that evaluates check id.
func ScenarioOf(id string) (string, bool) {
	c, ok := checkByID[id]
	return c.Scenario, ok
}
