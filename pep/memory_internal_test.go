package pep

import (
	"crypto/sha256"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
)

// TestMemoryGuards: an answer is kept only while the listener is live,
// if nothing was forgotten since its lookup began (the generation), and if
// its lookup began after the quiet time a change leaves; it expires.
func TestMemoryGuards(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	c := newMemory[int](func() time.Time { return now }, 10)
	k := sha256.Sum256([]byte("k"))
	kept := func() bool { _, _, ok := c.get(k); return ok }

	_, st, _ := c.get(k)
	c.put(k, 1, st, time.Minute)
	require.False(t, kept(), "kept while not listening")

	c.setLive(true, 0)
	_, st, _ = c.get(k)
	c.forget() // a change heard while the lookup was out
	c.put(k, 1, st, time.Minute)
	require.False(t, kept(), "an answer asked for before a change was kept")

	_, st, _ = c.get(k)
	c.put(k, 1, st, time.Minute)
	require.True(t, kept())
	now = now.Add(time.Minute)
	require.False(t, kept(), "kept past its lifetime")

	// A settle time: nothing asked for within it of a change is kept, even
	// with the generation unchanged.
	c.setLive(true, 2*time.Second)
	now = now.Add(time.Second)
	_, st, _ = c.get(k)
	c.put(k, 1, st, time.Minute)
	require.False(t, kept(), "an answer asked for within the settle time of the hello was kept")
	now = now.Add(time.Second)
	_, st, _ = c.get(k)
	c.put(k, 1, st, time.Minute)
	require.True(t, kept())
	c.forget()
	require.False(t, kept())
	now = now.Add(time.Second)
	_, st, _ = c.get(k)
	c.put(k, 1, st, time.Minute)
	require.False(t, kept(), "an answer asked for within the settle time of a change was kept")

	now = now.Add(time.Second)
	_, st, _ = c.get(k)
	c.put(k, 1, st, time.Minute)
	require.True(t, kept())
	c.setLive(false, 0)
	require.False(t, kept(), "kept after the listener was lost")

	c.setLive(true, 0)
	for i := range 11 {
		_, st, _ := c.get(sha256.Sum256([]byte{byte(i)}))
		c.put(sha256.Sum256([]byte{byte(i)}), i, st, time.Minute)
	}
	require.LessOrEqual(t, c.size(), 10, "past its bound")
}

// TestDecisionsKeepOnlyMarkedAllows: only an allow the PDP marked is kept,
// for the smaller of its max age and the gate's.
func TestDecisionsKeepOnlyMarkedAllows(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	d := &decisions{mem: newMemory[struct{}](func() time.Time { return now }, 10), maxAge: 10 * time.Second}
	d.mem.setLive(true, 0)
	ev := evaluation(Principal{SubjectType: "user", SubjectID: "alice", ActorID: "agent:demo"}, &Tool{Name: "t"}, map[string]any{"n": 1.0})
	marked := func(allow bool, age int) authzen.Decision {
		return authzen.Decision{Decision: allow, Context: authzen.Object{authzen.CtxCache: map[string]any{"max_age": float64(age)}}}
	}
	for _, dec := range []authzen.Decision{{Decision: true}, marked(false, 60), {Decision: false}} {
		key, st, res := d.lookup(ev)
		require.Equal(t, CacheMiss, res)
		d.keep(key, st, res, dec)
		_, _, res = d.lookup(ev)
		require.Equal(t, CacheMiss, res, "kept %v", dec)
	}
	key, st, res := d.lookup(ev)
	d.keep(key, st, res, marked(true, 60))
	_, _, res = d.lookup(ev)
	require.Equal(t, CacheHit, res)
	now = now.Add(10 * time.Second)
	_, _, res = d.lookup(ev)
	require.Equal(t, CacheMiss, res, "kept past the gate's max age")

	d.maxAge = time.Minute
	key, st, res = d.lookup(ev)
	d.keep(key, st, res, marked(true, 5))
	now = now.Add(5 * time.Second)
	_, _, res = d.lookup(ev)
	require.Equal(t, CacheMiss, res, "kept past the PDP's max age")

	// Another principal, argument or actor is another decision.
	key, st, res = d.lookup(ev)
	d.keep(key, st, res, marked(true, 60))
	for _, other := range []authzen.EvaluationRequest{
		evaluation(Principal{SubjectType: "user", SubjectID: "bob", ActorID: "agent:demo"}, &Tool{Name: "t"}, map[string]any{"n": 1.0}),
		evaluation(Principal{SubjectType: "user", SubjectID: "alice", ActorID: "agent:other"}, &Tool{Name: "t"}, map[string]any{"n": 1.0}),
		evaluation(Principal{SubjectType: "user", SubjectID: "alice", ActorID: "agent:demo", Prior: []string{"agent:root"}}, &Tool{Name: "t"}, map[string]any{"n": 1.0}),
		evaluation(Principal{SubjectType: "user", SubjectID: "alice", ActorID: "agent:demo"}, &Tool{Name: "t"}, map[string]any{"n": 2.0}),
		evaluation(Principal{SubjectType: "user", SubjectID: "alice", ActorID: "agent:demo"}, &Tool{Name: "t", Upstream: "u"}, map[string]any{"n": 1.0}),
	} {
		_, _, res := d.lookup(other)
		require.Equal(t, CacheMiss, res, "%v", other)
	}
	_, _, res = d.lookup(ev)
	require.Equal(t, CacheHit, res)

	// A re-evaluation presenting an approval records its use at the PDP:
	// never answered from the cache, nor kept, even if the PDP marked it.
	reeval := evaluation(Principal{SubjectType: "user", SubjectID: "alice", ActorID: "agent:demo"}, &Tool{Name: "t"}, map[string]any{"n": 1.0})
	reeval.Context = authzen.Object{authzen.CtxApproval: map[string]any{"id": "apr_1"}}
	for range 2 {
		key, st, res := d.lookup(reeval)
		require.Equal(t, CacheBypass, res)
		d.keep(key, st, res, marked(true, 60))
	}

	d.mem.setLive(false, 0)
	_, _, res = d.lookup(ev)
	require.Equal(t, CacheBypass, res)
}
