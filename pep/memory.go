package pep

import (
	"sync"
	"time"
)

// memory is what the gate remembers in place of a round trip (the callers
// it authenticated, the decisions the PDP let it reuse), kept honest by a
// listener that hears every change of what it remembers:
//   - It remembers only while the listener is live, starts empty each time
//     it becomes live, and empties and stops remembering as soon as the
//     listener is found lost: a change announced while nobody listened
//     cannot be missed.
//   - Every change heard empties it and advances its generation. A lookup
//     takes a stamp (the generation, the time) before it asks the source,
//     and its answer is kept only if the generation has not moved since:
//     an answer read before a change but returned after the change was
//     heard is not kept; one returned before is emptied by it.
//   - A change may also make it quiet for a while (settle): no answer
//     asked for before then is kept, for a source that may itself answer
//     from inputs up to that old.
//   - Entries expire whatever is heard, and past max entries it empties and
//     refills from the busiest keys.
type memory[V any] struct {
	now func() time.Time
	max int

	mu     sync.Mutex
	live   bool          // the listener is connected and hears changes
	gen    uint64        // advanced whenever the memory is emptied
	settle time.Duration // how long a change keeps it quiet
	quiet  time.Time     // answers asked for before this are not kept
	// listens counts the times live was set (tests wait for a reconnect).
	listens int
	m       map[[32]byte]remembered[V]
}

type remembered[V any] struct {
	v     V
	until time.Time
}

// stamp is when a lookup began, as put must check it.
type stamp struct {
	gen uint64
	at  time.Time
}

func newMemory[V any](now func() time.Time, max int) *memory[V] {
	return &memory[V]{now: now, max: max, m: map[[32]byte]remembered[V]{}}
}

// get returns the remembered value of k, or the stamp a lookup of k at the
// source must hand put. A nil memory remembers nothing.
func (c *memory[V]) get(k [32]byte) (V, stamp, bool) {
	var zero V
	if c == nil {
		return zero, stamp{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	st := stamp{gen: c.gen, at: c.now()}
	e, ok := c.m[k]
	if ok && c.live && st.at.Before(e.until) {
		return e.v, st, true
	}
	return zero, st, false
}

// put remembers v for k for ttl from st, if the listener is live, nothing
// was forgotten since st, and st is not from a quiet time.
func (c *memory[V]) put(k [32]byte, v V, st stamp, ttl time.Duration) {
	if c == nil || ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.live || st.gen != c.gen || st.at.Before(c.quiet) {
		return
	}
	if len(c.m) >= c.max {
		clear(c.m)
	}
	c.m[k] = remembered[V]{v: v, until: st.at.Add(ttl)}
}

// forget empties the memory (a change was heard).
func (c *memory[V]) forget() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgetLocked()
}

func (c *memory[V]) forgetLocked() {
	clear(c.m)
	c.gen++
	c.quiet = c.now().Add(c.settle)
}

// setLive empties the memory and says whether it may fill again; settle
// is how long each change (this one included) keeps it quiet.
func (c *memory[V]) setLive(live bool, settle time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.settle = max(settle, 0)
	c.forgetLocked()
	c.live = live
	if live {
		c.listens++
	}
}

// size is how many entries it holds (expired ones included).
func (c *memory[V]) size() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}
