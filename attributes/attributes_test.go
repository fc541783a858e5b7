package attributes_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/attributes"
	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func TestSetSnapshotAndHook(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	s := attributes.NewStore(db)
	snap, err := s.Snapshot(ctx)
	require.NoError(t, err)
	require.Empty(t, snap)

	ran := false
	require.NoError(t, s.Set(ctx, "risk_level", "high", "op", func(ctx context.Context, tx pgx.Tx) error { ran = true; return nil }))
	require.True(t, ran)
	snap, err = s.Snapshot(ctx)
	require.NoError(t, err)
	require.Equal(t, "high", snap["risk_level"], "a writer sees its own change at once")

	// Another replica sees it within a second.
	other := attributes.NewStore(db)
	snap, err = other.Snapshot(ctx)
	require.NoError(t, err)
	require.Equal(t, "high", snap["risk_level"])

	require.Error(t, s.Set(ctx, "Bad Key", 1, "op", nil))
	require.Error(t, s.Set(ctx, "rolled_back", 1, "op", func(context.Context, pgx.Tx) error { return context.Canceled }))
	snap, err = attributes.NewStore(db).Snapshot(ctx)
	require.NoError(t, err)
	require.NotContains(t, snap, "rolled_back", "a failing hook rolls the change back")

	require.NoError(t, s.Set(ctx, "risk_level", nil, "op", nil))
	snap, err = s.Snapshot(ctx)
	require.NoError(t, err)
	require.NotContains(t, snap, "risk_level")
	events, err := audit.Chain(ctx, db, audit.SystemChain)
	require.NoError(t, err)
	require.Len(t, events, 2)
}

// A listening replica empties its cache at another's change, long before
// its cache would expire, and again after its listening connection is lost.
func TestAListeningReplicaHearsAChange(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	listener := attributes.NewStore(db)
	listener.MaxAge = time.Hour
	require.NoError(t, listener.Start(ctx))
	t.Cleanup(listener.Stop)
	writer := attributes.NewStore(db)

	listenerPid := func() (pid int) {
		err := db.QueryRow(ctx, `SELECT coalesce(max(pid), 0) FROM pg_stat_activity
			WHERE application_name = $1 AND datname = current_database()
			AND state = 'idle' AND query LIKE 'LISTEN %'`, attributes.Listener).Scan(&pid) // its LISTEN done
		require.NoError(t, err)
		return pid
	}
	sees := func(want any) func() bool {
		return func() bool {
			snap, err := listener.Snapshot(ctx)
			require.NoError(t, err)
			return snap["change_freeze"] == want
		}
	}
	var first int
	require.Eventually(t, func() bool { first = listenerPid(); return first != 0 }, 10*time.Second, 10*time.Millisecond)
	snap, err := listener.Snapshot(ctx)
	require.NoError(t, err)
	require.NotContains(t, snap, "change_freeze")

	require.NoError(t, writer.Set(ctx, "change_freeze", true, "op", nil))
	require.Eventually(t, sees(true), 10*time.Second, 10*time.Millisecond, "the change was not heard")

	_, err = db.Exec(ctx, `SELECT pg_terminate_backend($1)`, first)
	require.NoError(t, err)
	require.Eventually(t, func() bool { pid := listenerPid(); return pid != 0 && pid != first }, 10*time.Second, 10*time.Millisecond,
		"the listener did not reconnect")
	require.Eventually(t, sees(true), 10*time.Second, 10*time.Millisecond) // cached again
	require.NoError(t, writer.Set(ctx, "change_freeze", false, "op", nil))
	require.Eventually(t, sees(false), 10*time.Second, 10*time.Millisecond, "the change after reconnecting was not heard")
}
