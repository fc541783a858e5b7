package webhook

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeNow is a clock the test moves.
type fakeNow struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeNow) now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeNow) set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

func newTestVerifier(t *testing.T) (*Verifier, *fakeNow) {
	t.Helper()
	v, err := NewVerifier(NewSecret())
	require.NoError(t, err)
	clock := &fakeNow{t: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)}
	v.Now = clock.now
	return v, clock
}

// TestMemoryReplayRemembersEveryIDUntilItsClaimEnds: the in-memory store
// keeps every claimed id for twice the tolerance, to the instant, however
// many ids it holds: its sweep (run once it holds 1,024) drops only claims
// that have ended, and then it holds only the live ones.
func TestMemoryReplayRemembersEveryIDUntilItsClaimEnds(t *testing.T) {
	ctx := context.Background()
	v, clock := newTestVerifier(t)
	t0 := clock.now()
	life := 2 * v.Tolerance

	// Well past the sweep's threshold, in two generations five minutes apart.
	const perGen = 1500
	ids := func(gen string) []string {
		out := make([]string, perGen)
		for i := range out {
			out[i] = fmt.Sprintf("msg_%s_%d", gen, i)
		}
		return out
	}
	old, young := ids("old"), ids("young")
	for _, id := range old {
		require.NoError(t, v.Claim(ctx, id))
	}
	clock.set(t0.Add(5 * time.Minute))
	for _, id := range young {
		require.NoError(t, v.Claim(ctx, id))
	}
	// Every one is still remembered, the first as well as the last.
	for _, id := range append(append([]string{}, old...), young...) {
		require.ErrorIs(t, v.Claim(ctx, id), ErrReplay, id)
	}

	// One instant before the old claims end, a sweep (a new id's claim
	// runs one) leaves them, and they are still refused.
	clock.set(t0.Add(life - time.Nanosecond))
	require.NoError(t, v.Claim(ctx, "msg_probe"))
	for _, id := range old {
		require.ErrorIs(t, v.Claim(ctx, id), ErrReplay, id)
	}
	// When they end, a sweep drops exactly them: the young stay refused,
	// and the store holds the young and the one new id.
	clock.set(t0.Add(life))
	require.NoError(t, v.Claim(ctx, "msg_new"))
	mem := v.Replay.(*memoryReplay)
	mem.mu.Lock()
	held := len(mem.until)
	mem.mu.Unlock()
	require.Equal(t, perGen+2, held, "the sweep keeps the live claims (the young and the probe) and drops the ended ones")
	for _, id := range young {
		require.ErrorIs(t, v.Claim(ctx, id), ErrReplay, id)
	}
	// An old id is new again (any copy signed before its claim fails the
	// timestamp check by now).
	for _, id := range old {
		require.NoError(t, v.Claim(ctx, id), id)
	}

	// The young, to the instant.
	clock.set(t0.Add(5*time.Minute + life - time.Nanosecond))
	require.ErrorIs(t, v.Claim(ctx, young[0]), ErrReplay)
	clock.set(t0.Add(5*time.Minute + life))
	require.NoError(t, v.Claim(ctx, young[0]))
}

// TestMemoryReplayConcurrentClaims: of many goroutines claiming the same
// ids at once, exactly one wins each id, and a released id can be claimed
// again by exactly one.
func TestMemoryReplayConcurrentClaims(t *testing.T) {
	ctx := context.Background()
	v, _ := newTestVerifier(t)
	const ids, claimers = 2000, 8
	won := make([]atomic.Int32, ids)
	var other atomic.Int32 // answers neither a win nor ErrReplay
	round := func() {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range claimers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for i := range ids {
					switch err := v.Claim(ctx, fmt.Sprint("msg_", i)); {
					case err == nil:
						won[i].Add(1)
					case !errors.Is(err, ErrReplay):
						other.Add(1)
					}
				}
			}()
		}
		close(start)
		wg.Wait()
		require.Zero(t, other.Load())
	}
	round()
	for i := range ids {
		require.EqualValues(t, 1, won[i].Load(), "claims of msg_%d that won", i)
	}
	for i := 0; i < ids; i += 2 {
		require.NoError(t, v.Release(ctx, fmt.Sprint("msg_", i)))
	}
	round()
	for i := range ids {
		want := 1 + (1 - i%2)
		require.EqualValues(t, want, won[i].Load(), "claims of msg_%d that won, after releasing the even ones", i)
	}
}
