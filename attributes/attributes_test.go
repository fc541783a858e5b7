package attributes_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

// A reload that read the old values and ends after a change emptied the
// cache keeps nothing: the next read sees the change, though the cache
// would otherwise hold the stale values for an hour. The change comes from
// the same Store (Set) and from another replica, heard by a listening one.
func TestStaleReloadIsNotCached(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		listen bool
		change func(t *testing.T, db *pgxpool.Pool, reader *attributes.Store)
	}{
		{"own change", false, func(t *testing.T, _ *pgxpool.Pool, reader *attributes.Store) {
			require.NoError(t, reader.Set(ctx, "risk_level", "high", "op", nil))
		}},
		{"another replica's change, heard", true, func(t *testing.T, db *pgxpool.Pool, reader *attributes.Store) {
			before := reader.Generation()
			require.NoError(t, attributes.NewStore(db).Set(ctx, "risk_level", "high", "op", nil))
			require.Eventually(t, func() bool { return reader.Generation() > before }, 10*time.Second, 10*time.Millisecond,
				"the listening store did not hear the change")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := dbtest.New(t)
			// Written before the reader listens, so the only emptying of
			// its cache still to come is the change's: a later one would
			// hide a stale cache.
			require.NoError(t, attributes.NewStore(db).Set(ctx, "risk_level", "low", "op", nil))
			reader := attributes.NewStore(db)
			reader.MaxAge = time.Hour
			if tc.listen {
				require.NoError(t, reader.Start(ctx))
				t.Cleanup(reader.Stop)
				// Listening empties the cache once (Live).
				require.Eventually(t, func() bool { return reader.Generation() >= 1 }, 10*time.Second, 10*time.Millisecond)
			}

			// The change lands after the reload's read, before it stores.
			changed := false
			reader.AfterRead(func() {
				if !changed {
					changed = true
					tc.change(t, db, reader)
				}
			})
			snap, err := reader.Snapshot(ctx)
			require.NoError(t, err)
			require.True(t, changed)
			require.Equal(t, "low", snap["risk_level"], "the reload read before the change")
			snap, err = reader.Snapshot(ctx)
			require.NoError(t, err)
			require.Equal(t, "high", snap["risk_level"], "the stale reload was cached")
		})
	}
}
