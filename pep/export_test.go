package pep

import (
	"context"
	"time"

	"github.com/omcp/arap/authzen"
)

// Hooks for the external tests (package pep_test), which run the gate
// against the real backend (internal/backendtest imports this package, so
// only an external test can use it) and need to act as a runner that read
// the task at one moment and acts on it later.

// Snapshot is an approval task as a runner read it.
type Snapshot = approvalTask

// Snapshot reads task id as Advance does before it acts.
func (g *Gate) Snapshot(ctx context.Context, id string) (*Snapshot, error) {
	return getApproval(ctx, g.cfg.DB, id)
}

// ExecuteSnapshot is what a runner holding s does once the PDP allowed the
// call with approval (id, until): execute.
func (g *Gate) ExecuteSnapshot(ctx context.Context, s *Snapshot, approvalID string, until time.Time) error {
	b, err := g.binding(s)
	if err != nil {
		return err
	}
	return g.execute(ctx, s, b, use{approvalID: approvalID, until: until})
}

// ReevaluateSnapshot is what a runner holding s does with the approval it
// read from the status endpoint: re-evaluate and act on the answer.
func (g *Gate) ReevaluateSnapshot(ctx context.Context, s *Snapshot, approval *authzen.Approval) error {
	_, err := g.reevaluate(ctx, s, approval)
	return err
}

// Stopping is closed once Stop has begun.
func (g *Gate) Stopping() <-chan struct{} { return g.bg.life.Done() }

// CallerMemory says whether the callers' listener is live, how often it has
// connected, and how many principals the gate's Callers remember.
func (g *Gate) CallerMemory() (live bool, listens, remembered int) {
	c := g.callers.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.live, c.listens, len(c.m)
}

// WatchDecisions runs the decision cache's watcher of the backend's change
// stream (which Start runs with the rest) until Stop.
func (g *Gate) WatchDecisions() { g.spawn(g.watchDecisions) }

// DecisionCache says whether the decision cache is in use, how often its
// stream has said hello, and how many decisions it holds.
func (g *Gate) DecisionCache() (live bool, listens, size int) {
	if g.decisions == nil {
		return false, 0, 0
	}
	m := g.decisions.mem
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.live, m.listens, len(m.m)
}

// LockLimits is the class of the principals' limit locks.
const LockLimits = lockLimits

// SubmitAndBind is what a runner that wrote intent key does next, however
// late (another binder may have bound it meanwhile).
func (g *Gate) SubmitAndBind(ctx context.Context, key string) error { return g.submitAndBind(ctx, key) }

const SubmitGrace = submitGrace

// WakeUps is how many callback wake-ups hold one of the gate's slots: a
// wake-up takes its slot as it starts (wake), before anything else.
func (g *Gate) WakeUps() int { return len(g.advance) }
