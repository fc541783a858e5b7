package pep

import (
	"context"
	"errors"
	"sync"
	"time"
)

// The gate's own background work: the advances that callbacks wake (Wake,
// in advance.go), the look sweep (look.go) and the reconciler. All of it runs under the gate's
// context, which Stop ends; Stop then waits for it, so nothing the gate
// started outlives it (a run already claimed still records its outcome:
// execute detaches from the context after the claim).

// background tracks the goroutines the gate started.
type background struct {
	life    context.Context // ends when the gate stops
	end     context.CancelFunc
	mu      sync.Mutex
	stopped bool
	running sync.WaitGroup
}

// spawn runs f under the gate's context, unless the gate has stopped; it
// reports whether f was started. Stop waits for f to return.
func (g *Gate) spawn(f func(ctx context.Context)) bool {
	g.bg.mu.Lock()
	defer g.bg.mu.Unlock()
	if g.bg.stopped {
		return false
	}
	g.bg.running.Add(1)
	go func() {
		defer g.bg.running.Done()
		f(g.bg.life)
	}()
	return true
}

// Start runs the look sweep (look.go), the reconciler (every
// Config.ReconcileEvery), the listener that lets the callers'
// authentication be remembered (Callers.Listen) and the watcher of the
// backend's change stream that lets allowed decisions be (watchDecisions). Callback wake-ups need no
// Start: they run from NewGate until Stop.
func (g *Gate) Start(context.Context) error {
	if !g.spawn(g.lookLoop) || !g.spawn(g.reconcileLoop) || !g.spawn(func(ctx context.Context) { g.callers.Listen(ctx, g.cfg.Log) }) || !g.spawn(g.watchDecisions) {
		return errors.New("pep: the gate has stopped")
	}
	return nil
}

// Stop ends the gate's context and waits for everything the gate started:
// wake-ups and looks in flight, the sweep and the reconciler. Nothing is started after it.
func (g *Gate) Stop() {
	g.bg.mu.Lock()
	g.bg.stopped = true
	g.bg.mu.Unlock()
	g.bg.end()
	g.bg.running.Wait()
}

// reconcileLoop runs Reconcile at once and then every ReconcileEvery, until
// ctx ends. It runs in every replica on purpose, not as a River periodic
// job: those run on the leader only, and a leader that was killed keeps its
// lease for a while, which is exactly when repair is needed. Replicas do not
// collide: each intent is leased before use.
func (g *Gate) reconcileLoop(ctx context.Context) {
	t := time.NewTicker(g.cfg.ReconcileEvery)
	defer t.Stop()
	for {
		round, cancel := context.WithTimeout(ctx, g.cfg.ReconcileEvery+30*time.Second)
		if err := g.Reconcile(round); err != nil && ctx.Err() == nil {
			g.cfg.Log.WarnContext(ctx, "reconcile failed", "error", err)
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
