package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"time"
)

// Fault kinds the scheduler draws (Fault.Kind); fault points add
// "point:<name>" when an armed point kills its process.
const (
	FaultKill    = "kill-9"
	FaultPGFast  = "pg-stop-fast"
	FaultPGCrash = "pg-stop-immediate"
	FaultLatency = "net-latency"
	FaultStall   = "net-stall"
	FaultReset   = "net-reset"
	FaultCut     = "net-cut"
)

// plan is one scheduled fault: what, on which target, when and how long.
type plan struct {
	At     time.Duration // from the start of the fault phase
	Kind   string
	Target string
	For    time.Duration
}

// schedule draws n faults over d from the seed: the same seed gives the
// same list (timing of the system under it varies).
func schedule(seed int64, n int, d time.Duration, procs, proxies []string) []plan {
	rng := rand.New(rand.NewPCG(uint64(seed), uint64(seed)^0x5eed))
	out := make([]plan, 0, n)
	step := d / time.Duration(max(n, 1))
	for i := range n {
		p := plan{At: time.Duration(i)*step + time.Duration(rng.Int64N(int64(step)+1))/2}
		// Of 100 faults: 4 PostgreSQL fast stops, 4 crashes, 37 kills, 55
		// network faults.
		switch x := rng.IntN(100); {
		case x < 4:
			p.Kind = FaultPGFast
			p.For = time.Duration(300+rng.IntN(1500)) * time.Millisecond
		case x < 8:
			p.Kind = FaultPGCrash
			p.For = time.Duration(300+rng.IntN(1500)) * time.Millisecond
		case x < 45:
			p.Kind, p.Target = FaultKill, procs[rng.IntN(len(procs))]
		default:
			p.Kind = []string{FaultLatency, FaultStall, FaultReset, FaultCut}[rng.IntN(4)]
			p.Target = proxies[rng.IntN(len(proxies))]
			p.For = time.Duration(200+rng.IntN(2500)) * time.Millisecond
		}
		if p.Target == "" {
			p.Target = "postgresql"
		}
		out = append(out, p)
	}
	return out
}

// failoverHoldWait is how long a due failover waits for a front-end held
// inside the claim window before it strikes at a random moment.
const failoverHoldWait = 3 * time.Second

// withFailovers adds n failovers, evenly spread over d, to plans.
func withFailovers(plans []plan, n int, d time.Duration) []plan {
	for i := range n {
		plans = append(plans, plan{At: d * time.Duration(i) / time.Duration(max(n, 1)), Kind: FaultFailover, Target: "postgresql"})
	}
	sort.SliceStable(plans, func(i, j int) bool { return plans[i].At < plans[j].At })
	return plans
}

func toxicOf(kind string, rng *rand.Rand) (string, string) {
	switch kind {
	case FaultLatency:
		return "latency", fmt.Sprintf(`{"latency":%d,"jitter":%d}`, 100+rng.IntN(1500), rng.IntN(200))
	case FaultStall:
		return "timeout", `{"timeout":0}` // data held until removed: a stalled network
	case FaultReset:
		return "reset_peer", fmt.Sprintf(`{"timeout":%d}`, rng.IntN(200))
	default:
		return "cut", ""
	}
}

// inject runs the schedule; it returns when the last fault has been
// injected and healed.
func (s *system) inject(ctx context.Context, plans []plan, seed int64) {
	rng := rand.New(rand.NewPCG(uint64(seed)+1, 7))
	byName := map[string]*proc{}
	for _, p := range s.procs {
		byName[p.name] = p
	}
	start := time.Now()
	done := make(chan struct{}, len(plans))
	for _, p := range plans {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(start.Add(p.At))):
		}
		kind, attrs := toxicOf(p.Kind, rng)
		go func(p plan) {
			defer func() { done <- struct{}{} }()
			t0 := time.Now()
			switch p.Kind {
			case FaultKill:
				byName[p.Target].kill()
				s.events.fault(p.Kind, p.Target, t0, t0.Add(time.Second))
			case FaultFailover:
				s.pair.scheduled(ctx, failoverHoldWait)
			case FaultPGFast, FaultPGCrash:
				if s.pair != nil {
					s.pair.scheduled(ctx, failoverHoldWait)
					return
				}
				if err := s.pgFault(ctx, p.Kind == FaultPGCrash, p.For); err != nil {
					fmt.Fprintf(s.log, "chaos: PostgreSQL did not restart: %v\n", err)
				}
				s.events.fault(p.Kind, p.Target, t0, time.Now())
			default:
				if err := s.px.toxic(p.Target, kind, attrs); err != nil {
					return // a toxic of the same kind is already on: counted once
				}
				time.Sleep(p.For)
				s.px.heal(p.Target)
				s.events.fault(p.Kind, p.Target, t0, time.Now())
			}
		}(p)
	}
	for range plans {
		<-done
	}
}
