package pep

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/riverqueue/river"

	"github.com/omcp/arap/authzen"
)

// Queue is the River queue of the front-end's jobs; the backend's workers,
// which may share the database, do not take from it.
const Queue = "pep"

// TrackArgs is the tracking job older versions enqueued for each approval
// task (and for a follow-up look). Tasks are now looked at by each
// replica's look sweep (look.go); a tracking job still queued by an older
// replica during an upgrade brings its task's look forward and ends.
type TrackArgs struct {
	TaskID string `json:"task_id"`
}

// Kind implements river.JobArgs.
func (TrackArgs) Kind() string { return "pep.track" }

// TrackWorker runs TrackArgs.
type TrackWorker struct {
	river.WorkerDefaults[TrackArgs]
	Gate *Gate
}

// Work hands the task to the look sweep.
func (w *TrackWorker) Work(ctx context.Context, job *river.Job[TrackArgs]) error {
	return lookSoon(ctx, w.Gate.cfg.DB, job.Args.TaskID, w.Gate.now())
}

// PurgeArgs is the periodic retention job.
type PurgeArgs struct{}

// Kind implements river.JobArgs.
func (PurgeArgs) Kind() string { return "pep.purge" }

// PurgeWorker runs Purge.
type PurgeWorker struct {
	river.WorkerDefaults[PurgeArgs]
	Gate *Gate
}

// Work runs one purge.
func (w *PurgeWorker) Work(ctx context.Context, _ *river.Job[PurgeArgs]) error {
	_, err := w.Gate.Purge(ctx)
	return err
}

// AddWorkers registers the front-end's workers.
func (g *Gate) AddWorkers(w *river.Workers) {
	river.AddWorker(w, &TrackWorker{Gate: g})
	river.AddWorker(w, &PurgeWorker{Gate: g})
}

// PeriodicJobs are the front-end's scheduled jobs (run by River's leader).
func (g *Gate) PeriodicJobs() []*river.PeriodicJob {
	opts := &river.InsertOpts{Queue: Queue}
	return []*river.PeriodicJob{
		river.NewPeriodicJob(river.PeriodicInterval(time.Hour), func() (river.JobArgs, *river.InsertOpts) { return PurgeArgs{}, opts },
			&river.PeriodicJobOpts{RunOnStart: true}),
	}
}

// Reconcile repairs what a crash can leave behind:
//   - an intent never bound to its task is resubmitted under its key (the
//     backend returns the request it already has, or creates it) and bound;
//     if its task has ended meanwhile, the request is cancelled;
//   - an abandoned intent (its task failed before binding, the submission's
//     fate unknown) is resubmitted to find a request that may exist, which is
//     cancelled (a request that never existed is refused as expired).
//
// No intent is ever submitted under a new key, so nothing is submitted
// twice. (A claimed task past its execution deadline is the look sweep's:
// the claim schedules the task's look at that deadline.)
func (g *Gate) Reconcile(ctx context.Context) error {
	idleBefore := g.now().Add(-g.cfg.IntentGrace)
	list, err := idleIntents(ctx, g.cfg.DB, idleBefore)
	if err != nil {
		return fmt.Errorf("pep: reconcile: %w", err)
	}
	for _, o := range list {
		if ok, err := leaseIntent(ctx, g.cfg.DB, o.key, o.state, idleBefore); err != nil || !ok {
			continue
		}
		in, err := g.loadIntent(ctx, o.key)
		if errors.Is(err, errIntentEnded) {
			continue // its binder was only slow
		}
		if err != nil {
			g.cfg.Log.ErrorContext(ctx, "reconcile: intent unreadable", "error", err)
			continue
		}
		tr, err := g.submit(ctx, in)
		switch {
		case errors.Is(err, errUncertain) && o.state == intentOpen && g.pastSubmitDeadline(in.Body):
			// Past the denial's expiry no first submission is accepted:
			// the task ends failed (the backend could not be reached in
			// time), the intent abandoned, so a request that may exist is
			// found and cancelled by a later round.
			err = g.failIntent(ctx, in, false, err)
		case errors.Is(err, errUncertain):
			continue // try again next round
		case err != nil: // refused: no request exists under this key
			if o.state == intentOpen {
				err = g.failIntent(ctx, in, true, err)
			} else {
				err = intentSettled.apply(ctx, g.cfg.DB, in.Key, ``)
			}
		case o.state == intentOpen:
			g.cfg.Log.InfoContext(ctx, "reconcile: binding an intent left unbound", "task_id", in.TaskID)
			err = g.bind(ctx, in, tr)
		default: // abandoned, and the request exists: cancel it
			if cancelURL, _ := tr.Task.Links["cancel"].(string); cancelURL != "" && tr.Task.Status == authzen.StatusPending {
				g.cancelBackend(ctx, cancelURL)
			}
			err = intentSettled.apply(ctx, g.cfg.DB, in.Key, ``)
		}
		if err != nil {
			g.cfg.Log.ErrorContext(ctx, "reconcile: intent not settled; next round retries", "task_id", in.TaskID, "error", err)
		}
	}

	return nil
}

// Purge deletes terminal tasks past their TTL (with their sealed arguments
// and submission bodies), spent MRTR nonces and expired webhook-id claims.
func (g *Gate) Purge(ctx context.Context) (int64, error) {
	n, err := g.tasks.Purge(ctx)
	if err != nil {
		return 0, err
	}
	if _, err = g.cfg.DB.Exec(ctx, `DELETE FROM pep.used_states WHERE expires_at < $1`, g.now()); err != nil {
		return n, err
	}
	_, err = (&WebhookIDs{DB: g.cfg.DB, Now: g.now}).Purge(ctx)
	return n, err
}

// submitGrace is how long past its denial's expiry a submission is still
// tried: the backend accepts a denial up to its clock skew (30 s by
// default) after it expires.
const submitGrace = time.Minute

// pastSubmitDeadline reports whether a submission body's first submission
// can no longer be accepted: its denial's expires_at plus submitGrace has
// passed (a body without one, which this gate never writes, never is).
func (g *Gate) pastSubmitDeadline(body []byte) bool {
	var b struct {
		Denial struct {
			ExpiresAt time.Time `json:"expires_at"`
		} `json:"denial"`
	}
	if json.Unmarshal(body, &b) != nil || b.Denial.ExpiresAt.IsZero() {
		return false
	}
	return g.now().After(b.Denial.ExpiresAt.Add(submitGrace))
}
