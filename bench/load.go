// Package bench measures arap under load: a closed-loop load generator, the
// operations worth measuring (evaluate, allowed and requestable apart;
// submit, status, the MCP gate, approve-to-complete), the baselines they
// are compared with in the same run (a trivial HTTP JSON handler, a
// single-row INSERT commit), and a system it starts for the purpose
// (private PostgreSQL, arapd serve and arapd mcp as separate processes, so
// each one's memory can be read).
package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Op is one operation. It returns how long the measured part took; zero
// means the whole call is measured (an op may do untimed set-up first).
type Op func(ctx context.Context, worker int) (time.Duration, error)

// Stats are one measurement.
type Stats struct {
	Name        string        `json:"name"`
	Concurrency int           `json:"concurrency"`
	N           int           `json:"n"`
	Errors      int           `json:"errors"`
	FirstError  string        `json:"first_error,omitempty"`
	Elapsed     time.Duration `json:"elapsed_ns"`
	PerSecond   float64       `json:"per_second"`
	P50         time.Duration `json:"p50_ns"`
	P99         time.Duration `json:"p99_ns"`
	Max         time.Duration `json:"max_ns"`
}

// Measure runs op from concurrency workers, each calling it in a loop: for
// warm-up first (not recorded), then for d. Throughput counts successful
// calls over the measured wall time.
func Measure(ctx context.Context, name string, concurrency int, warm, d time.Duration, op Op) Stats {
	s := Stats{Name: name, Concurrency: concurrency}
	if warm > 0 {
		run(ctx, concurrency, warm, op)
	}
	start := time.Now()
	lat, errs := run(ctx, concurrency, d, op)
	s.Elapsed = time.Since(start)
	for _, e := range errs {
		if e != nil {
			s.Errors++
			if s.FirstError == "" {
				s.FirstError = e.Error()
			}
		}
	}
	s.N = len(lat)
	if s.N == 0 {
		return s
	}
	slices.Sort(lat)
	s.PerSecond = float64(s.N) / s.Elapsed.Seconds()
	s.P50 = lat[s.N*50/100]
	s.P99 = lat[min(s.N*99/100, s.N-1)]
	s.Max = lat[s.N-1]
	return s
}

func run(ctx context.Context, concurrency int, d time.Duration, op Op) ([]time.Duration, []error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var mu sync.Mutex
	var all []time.Duration
	var errs []error
	var wg sync.WaitGroup
	for w := range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []time.Duration
			var werrs []error
			for ctx.Err() == nil {
				t0 := time.Now()
				took, err := op(ctx, w)
				if took == 0 {
					took = time.Since(t0)
				}
				if ctx.Err() != nil && err != nil {
					break // cut off by the deadline: neither a result nor an error
				}
				if err != nil {
					werrs = append(werrs, err)
					continue
				}
				lat = append(lat, took)
			}
			mu.Lock()
			all = append(all, lat...)
			errs = append(errs, werrs...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return all, errs
}

func (s Stats) String() string {
	return fmt.Sprintf("%s: %d ok, %d errors, %.0f/s, p50 %s, p99 %s", s.Name, s.N, s.Errors, s.PerSecond, ms(s.P50), ms(s.P99))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond)) }
