package host_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/host"
	"github.com/omcp/arap/internal/pgembed"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestDurabilityAtStart (issue 36 items 2 and 3): a host logs the
// durability its database gives once, at warn level when a failover could
// lose a claim (here: an asynchronous standby, none synchronous), and
// refuses to start on a read-only database (a standby), saying so and
// what to do; with a synchronous standby it logs at info.
func TestDurabilityAtStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.NewReplicated(t)
	_, standbyURL := db.Standby(t, pgembed.StandbyOptions{Name: "async_one"})

	start := func(url string) (*host.Host, string, error) {
		var out syncBuffer
		h, err := host.New(ctx, host.Config{Name: "test", Addr: "127.0.0.1:0", DatabaseURL: url,
			Log: slog.New(slog.NewTextHandler(&out, nil))})
		if h != nil {
			t.Cleanup(h.Close)
		}
		return h, out.String(), err
	}
	_, logged, err := start(db.URL)
	require.NoError(t, err)
	require.Equal(t, 1, strings.Count(logged, "database durability"), logged)
	require.Contains(t, logged, `level=WARN msg="database durability: a failover could lose an execution claim"`)
	require.Contains(t, logged, "no synchronous standby is configured")
	require.Contains(t, logged, "standbys streaming: 0 synchronous, 0 potential, 1 asynchronous")

	_, _, err = start(standbyURL)
	require.ErrorContains(t, err, "the database is read-only: in recovery (a standby)")
	require.ErrorContains(t, err, "point the database URL at the primary")

	db.Standby(t, pgembed.StandbyOptions{Name: "sync_one", Synchronous: true})
	_, logged, err = start(db.URL)
	require.NoError(t, err)
	require.Contains(t, logged, `level=INFO msg="database durability"`)
	require.NotContains(t, logged, "warning=")
}
