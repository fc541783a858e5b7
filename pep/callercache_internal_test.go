package pep

import (
	"crypto/sha256"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCallerCacheKeepsNoAnswerReadBeforeARevocation: a lookup that read
// the table before a revocation was heard (its generation is older) is not
// remembered, so it cannot outlive the notification that emptied the
// memory while it was in flight.
func TestCallerCacheKeepsNoAnswerReadBeforeARevocation(t *testing.T) {
	now := time.Now()
	c := newCallerCache(func() time.Time { return now })
	h := sha256.Sum256([]byte("token"))
	p := Principal{Name: "a", SubjectType: "user", SubjectID: "bob"}

	_, gen, ok := c.get(h)
	require.False(t, ok)
	c.put(h, p, gen, callerCacheTTL)
	_, _, ok = c.get(h)
	require.False(t, ok, "remembered while not listening")

	c.setLive(true, 0)
	_, gen, _ = c.get(h)
	c.forget() // a revocation heard while the lookup was at the table
	c.put(h, p, gen, callerCacheTTL)
	_, _, ok = c.get(h)
	require.False(t, ok, "an answer read before the revocation was remembered")

	_, gen, _ = c.get(h)
	c.put(h, p, gen, callerCacheTTL)
	got, _, ok := c.get(h)
	require.True(t, ok)
	require.Equal(t, p, got)

	now = now.Add(callerCacheTTL)
	_, _, ok = c.get(h)
	require.False(t, ok, "remembered past its lifetime")

	now = now.Add(-callerCacheTTL)
	c.setLive(false, 0)
	_, _, ok = c.get(h)
	require.False(t, ok, "remembered after the listener was lost")
}
