package pep

import (
	"context"
	"sync"
	"time"
)

// Looking at approval tasks. A task waiting for a decision (pending) or
// running its tool (claimed) has a time for its next look
// (its look_at, in state.go): its binding sets the first, each look
// (Advance) the next, and the claim the execution deadline. Every replica
// runs a sweep that takes the due tasks and looks at each one: a lease,
// not a lock, so that a replica that dies mid-look delays its tasks by at
// most LookLease. A callback's wake-up (Wake) looks at once, besides.
//
// This replaced a River tracking job per task: River rescues the job of a
// killed worker only after twice the job timeout, and then retries it with
// a backoff that grows with every error, so a task whose replica died more
// than once could wait minutes past its decision; and the job's insert was
// the costliest statement of a gated call's binding (docs/performance.md).

// LookLease is how long a look taken by the sweep holds its task, and may
// take: a callback's wake-up's budget, room for a status read and a
// re-evaluation (30 s) beside the execution (ExecTimeout). Another replica
// may take the task once it has passed. A look that outlives it is given
// up (its context ends); a run it claimed goes on, and its claim is looked
// at, and reaped if never recorded, at the execution deadline.
func (g *Gate) LookLease() time.Duration { return g.cfg.ExecTimeout + 30*time.Second }

// lookEvery is how often each replica's sweep takes due tasks; lookWorkers
// bounds the looks one replica runs at once.
const (
	lookEvery   = time.Second
	lookWorkers = 20
)

// lookLoop runs the sweep until ctx ends: every lookEvery, and at once
// again while it finds as many due tasks as it has room for.
func (g *Gate) lookLoop(ctx context.Context) {
	slots := make(chan struct{}, lookWorkers)
	t := time.NewTicker(lookEvery)
	defer t.Stop()
	for {
		room := cap(slots) - len(slots) // only this loop fills slots
		taken := 0
		if room > 0 {
			ids, err := takeLooks(ctx, g.cfg.DB, g.now(), g.now().Add(g.LookLease()), room)
			if err != nil && ctx.Err() == nil {
				g.cfg.Log.WarnContext(ctx, "look sweep failed", "error", err)
			}
			for _, id := range ids {
				slots <- struct{}{}
				if !g.spawn(func(ctx context.Context) { defer func() { <-slots }(); g.look(ctx, id) }) {
					<-slots // stopping: the lease hands the task to the next replica
				}
			}
			taken = len(ids)
		}
		if taken > 0 && taken == room {
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// LookDue is one round of the sweep, run in the caller: it looks at (at
// most lookWorkers of) the tasks whose look is due, and returns how many
// once every look has returned. The error is the sweep's; the looks' are
// logged (each is looked at again when its lease ends).
func (g *Gate) LookDue(ctx context.Context) (int, error) {
	ids, err := takeLooks(ctx, g.cfg.DB, g.now(), g.now().Add(g.LookLease()), lookWorkers)
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() { g.look(ctx, id) })
	}
	wg.Wait()
	return len(ids), err
}

// look advances task id once, within its lease.
func (g *Gate) look(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(ctx, g.LookLease())
	defer cancel()
	if _, err := g.Advance(ctx, id); err != nil && g.bg.life.Err() == nil {
		g.cfg.Log.WarnContext(ctx, "look failed; the task is looked at again when its lease ends", "task_id", id, "error", err)
	}
}
