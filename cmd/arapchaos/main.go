// Command arapchaos runs arap under random faults (kill -9, PostgreSQL
// restarts, network faults, armed fault points) and checks the history.
// It exits non-zero on any violation or unsettled task.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/omcp/arap/chaos"
)

func main() {
	o := &chaos.Options{Log: os.Stderr}
	flag.IntVar(&o.Faults, "faults", 50, "faults to inject")
	flag.DurationVar(&o.Duration, "duration", 2*time.Minute, "length of the fault phase")
	flag.Int64Var(&o.Seed, "seed", 1, "seed of the fault schedule, the callers and the approvers")
	flag.IntVar(&o.Callers, "callers", 16, "concurrent callers, one principal each")
	flag.Float64Var(&o.PointP, "point-p", 0.03, "probability with which every fault point kills its process (0: unarmed)")
	flag.DurationVar(&o.RequestTTL, "request-ttl", 20*time.Second, "how long a backend request waits for a decision")
	flag.DurationVar(&o.ExecTimeout, "exec-timeout", 5*time.Second, "arapd mcp --exec-timeout: a claimed run not recorded by then ends outcome-unknown")
	flag.DurationVar(&o.JobTimeout, "job-timeout", 20*time.Second, "arapd serve --job-timeout: a callback delivery whose worker died is retried after twice this")
	flag.DurationVar(&o.SettleBound, "settle", 2*time.Minute, "bound on settling after the faults stop (part of the verdict)")
	flag.StringVar(&o.Bin, "bin", "", "directory holding arapd and arapctl (default: build them)")
	flag.BoolVar(&o.Keep, "keep", false, "keep the work directory (logs, cluster)")
	flag.StringVar(&o.HistoryFile, "history", "", "write the history and violations as JSON to this file")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r, err := chaos.Run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "arapchaos:", err)
		os.Exit(2)
	}
	s := chaos.Summarize(r.History, r.Violations, r.PointHits)
	fmt.Printf("arapchaos: seed %d, %d faults over %s, run took %s\n", o.Seed, o.Faults, o.Duration, r.Elapsed.Round(time.Second))
	s.Print(os.Stdout, r.History, r.Violations)
	if failed := s.Failures(r.History, o.PointP > 0); len(failed) > 0 {
		fmt.Println("arapchaos: FAILED:", strings.Join(failed, "; "))
		os.Exit(1)
	}
}
