// Command arapbench measures arap on this machine: it starts a private
// PostgreSQL, `arapd serve` and `arapd mcp`, and measures throughput and
// p50/p99 latency of evaluate, submit, status, the MCP gate and
// approve-to-complete, next to two baselines measured in the same run with
// the same load generator (a trivial HTTP JSON handler, single-row INSERT
// commits), and each server's peak RSS. See docs/performance.md.
//
//	go run ./cmd/arapbench [--concurrency 16] [--duration 10s] [--ops evaluate,submit] [--statements 15] [--json]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/omcp/arap/bench"
)

func main() {
	fs := flag.NewFlagSet("arapbench", flag.ExitOnError)
	conc := fs.Int("concurrency", 16, "concurrent workers for the throughput measurements")
	latConc := fs.Int("latency-concurrency", 4, "concurrent workers for status and approve-to-complete, which have latency targets")
	dur := fs.Duration("duration", 10*time.Second, "measured time per operation")
	warm := fs.Duration("warmup", 2*time.Second, "unrecorded warm-up per operation")
	ops := fs.String("ops", strings.Join(bench.AllOps, ","), "operations to measure")
	rows := fs.Int("status-rows", 1_000_000, "fill arap.requests to this many rows before measuring status")
	callers := fs.Int("callers", 2000, "MCP principals to spread the gate load over (each may hold 20 live tasks)")
	bin := fs.String("bin", "", "directory with arapd and arapctl (default: build them; run from the module root)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	pprof := fs.Bool("pprof", false, "serve profiles of arapd serve on 127.0.0.1:6060 and arapd mcp on 127.0.0.1:6061 during the run")
	statements := fs.Int("statements", 0, "profile PostgreSQL during each measurement (pg_stat_statements) and print this many statements by time")
	_ = fs.Parse(os.Args[1:])

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	s, err := bench.Start(ctx, bench.Options{Bin: *bin, Callers: *callers, Pprof: *pprof, Statements: *statements > 0, Log: os.Stderr})
	if err != nil {
		fmt.Fprintln(os.Stderr, "arapbench:", err)
		os.Exit(1)
	}
	defer s.Stop()
	r, err := bench.Run(ctx, s, bench.Config{Concurrency: *conc, LatencyConcurrency: *latConc, Duration: *dur, Warmup: *warm,
		Ops: strings.Split(*ops, ","), StatusRows: *rows, Statements: *statements, Log: os.Stderr})
	if err != nil {
		fmt.Fprintln(os.Stderr, "arapbench:", err)
		s.Stop()
		os.Exit(1)
	}
	if *asJSON {
		_ = json.NewEncoder(os.Stdout).Encode(r)
		return
	}
	r.Print(os.Stdout)
}
