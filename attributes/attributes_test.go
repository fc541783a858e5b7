package attributes_test

import (
	"context"
	"testing"

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
