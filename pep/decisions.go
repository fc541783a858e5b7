package pep

import (
	"context"
	"crypto/sha256"
	"time"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/authzen"
)

// The decision cache: allowed decisions the PDP marked cacheable
// (authzen.CtxCache), reused for the same evaluation request instead of a
// round trip to the backend, while the backend's change stream tells this
// process of every change such a decision may depend on.
//
//   - What is kept: only an allow the PDP marked (the PDP marks one only
//     when the conditions it evaluated read nothing but the request and
//     inputs whose every change is announced: no clock, no window, no
//     unannounced source; never a denial, a requestable denial or a
//     re-evaluation with an approval), for the smaller of the PDP's max
//     age and DecisionMaxAge. A denial is never kept, so it is always asked
//     again.
//   - The key: SHA-256 of the RFC 8785 form of the whole evaluation request
//     (subject with its actor chain and, for OAuth callers, issuer and
//     client; action; resource with the tool, its arguments, upstream,
//     upstream tool and annotations; context). It is everything the PDP
//     sees but the front-end's own client, which is fixed per process; the
//     request holds nothing per call (no request id, no time).
//   - When it is used: only while the change stream (arapclient.Changes)
//     is open and has said hello. Every change on it empties the cache;
//     a stream lost or refused empties it and turns it off until the next
//     hello. A caller revoked here or heard revoked empties it too (not
//     needed: it is keyed by principal and read only after authentication).
//   - The race between an evaluation in flight and a change: the answer is
//     kept only if no change was heard since the request was sent (the
//     memory's generation), and not if it was sent within the backend's
//     settle time of the last change or hello (the backend may still have
//     decided from attributes older than the change).
//
// A reused decision changes nothing else of the call: it is authenticated,
// rate-limited, forwarded, counted (arap_pep_calls_total) and logged as
// before; its access-log line says decision=cache (decision=pdp when the
// PDP was asked), and arap_pep_decision_cache_total counts hits, misses
// and calls that could not use the cache.

const (
	// DefaultDecisionCache is how many allowed decisions are remembered by
	// default (Config.DecisionCache).
	DefaultDecisionCache = 10000
	// DefaultDecisionMaxAge bounds how long one is (Config.DecisionMaxAge).
	DefaultDecisionMaxAge = time.Minute
)

// Results of a decision cache lookup (arap_pep_decision_cache_total).
const (
	CacheHit    = "hit"    // reused
	CacheMiss   = "miss"   // asked the PDP; the cache is in use
	CacheBypass = "bypass" // asked the PDP; the cache is off (no change stream)
)

// decisions is the gate's decision cache; nil when it is off.
type decisions struct {
	mem    *memory[struct{}]
	maxAge time.Duration
}

// decisionKey identifies an evaluation request; false when it cannot be
// put in canonical form (it is then simply not cached).
func decisionKey(ev authzen.EvaluationRequest) ([32]byte, bool) {
	c, err := authzen.Canonical(map[string]any{"subject": ev.Subject, "action": ev.Action, "resource": ev.Resource, "context": ev.Context})
	if err != nil {
		return [32]byte{}, false
	}
	return sha256.Sum256(c), true
}

// lookup finds the cached allow of ev (CacheHit), or says the PDP must be
// asked (CacheMiss, with the key and stamp keep must be handed; CacheBypass
// while the cache is off).
func (d *decisions) lookup(ev authzen.EvaluationRequest) (key [32]byte, st stamp, result string) {
	if d == nil || !d.live() {
		return key, st, CacheBypass
	}
	if _, ok := ev.Context[authzen.CtxApproval]; ok {
		// A re-evaluation records the approval's use at the PDP: never
		// answered here, whatever the PDP marks.
		return key, st, CacheBypass
	}
	key, ok := decisionKey(ev)
	if !ok {
		return key, st, CacheBypass
	}
	_, st, hit := d.mem.get(key)
	if hit {
		return key, st, CacheHit
	}
	return key, st, CacheMiss
}

// keep remembers the PDP's decision dec after a miss, if it marked it
// cacheable.
func (d *decisions) keep(key [32]byte, st stamp, result string, dec authzen.Decision) {
	if d == nil || result != CacheMiss {
		return
	}
	if age := dec.Cacheable(); age > 0 {
		d.mem.put(key, struct{}{}, st, min(age, d.maxAge))
	}
}

func (d *decisions) live() bool {
	d.mem.mu.Lock()
	defer d.mem.mu.Unlock()
	return d.mem.live
}

// forget empties the cache: cause is what changed.
func (g *Gate) forgetDecisions(cause string) {
	if g.decisions == nil {
		return
	}
	g.decisions.mem.forget()
	g.cfg.Metrics.decisionsForgotten(cause)
}

// watchDecisions keeps the decision cache in use while the backend's change
// stream is open, until ctx ends: it connects, turns the cache on at the
// hello, empties it at every change, and turns it off (empty) when the
// stream ends, then connects again with backoff. The gate runs it (Start).
func (g *Gate) watchDecisions(ctx context.Context) {
	d := g.decisions
	if d == nil {
		return
	}
	backoff := minWatchBackoff
	for ctx.Err() == nil {
		since := time.Now()
		err := g.cfg.Backend.Changes(ctx, func(c arapclient.Change) {
			if c.Hello {
				d.mem.setLive(true, c.Settle)
				g.cfg.Log.InfoContext(ctx, "decision cache on: hearing the backend's changes", "epoch", c.Epoch)
				return
			}
			d.mem.forget()
			g.cfg.Metrics.decisionsForgotten(c.Kind)
		})
		d.mem.setLive(false, 0)
		if ctx.Err() != nil {
			return
		}
		g.cfg.Metrics.decisionsForgotten(causeStreamLost)
		g.cfg.Log.WarnContext(ctx, "decision cache off: the backend's change stream ended; every call asks the PDP until it is back", "error", err)
		if time.Since(since) > maxWatchBackoff {
			backoff = minWatchBackoff
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxWatchBackoff)
	}
}

// causeStreamLost is the invalidation cause of a change stream that ended;
// causeCaller that of a caller revoked here. The others are the stream's
// kinds (policy, attributes, directory, client).
const (
	causeStreamLost = "stream-lost"
	causeCaller     = "caller"
)

// Backoff between change stream connections.
const (
	minWatchBackoff = 250 * time.Millisecond
	maxWatchBackoff = 30 * time.Second
)
