package ratelimit

import (
	"context"
	"time"

	"github.com/riverqueue/river"
)

// PurgeEvery is how often the windows that have ended are deleted. A table
// holds at most each active key's rows of this long, which stays small.
const PurgeEvery = 10 * time.Minute

// PurgeArgs is the periodic job that deletes ended windows.
type PurgeArgs struct{}

// Kind implements river.JobArgs.
func (PurgeArgs) Kind() string { return "ratelimit.purge" }

// PurgeWorker runs Counters.Purge.
type PurgeWorker struct {
	river.WorkerDefaults[PurgeArgs]
	Counters *Counters
}

// Work runs one purge.
func (w *PurgeWorker) Work(ctx context.Context, _ *river.Job[PurgeArgs]) error {
	_, err := w.Counters.Purge(ctx)
	return err
}

// AddWorker registers the purge worker of c. A River client (one per
// schema) purges one table.
func (c *Counters) AddWorker(w *river.Workers) { river.AddWorker(w, &PurgeWorker{Counters: c}) }

// PeriodicJob schedules the purge (run by the River leader), inserted with
// opts (the queue).
func (c *Counters) PeriodicJob(opts *river.InsertOpts) *river.PeriodicJob {
	return river.NewPeriodicJob(river.PeriodicInterval(PurgeEvery),
		func() (river.JobArgs, *river.InsertOpts) { return PurgeArgs{}, opts },
		&river.PeriodicJobOpts{RunOnStart: true})
}
