package arap_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/attributes"
	"github.com/omcp/arap/internal/backendtest"
)

// TestBackendListensForAttributeChanges: a running backend holds the
// attributes' listener (attributes.TestAListeningReplicaHearsAChange shows
// what it does), so an attribute changed elsewhere (arapctl) is heard.
func TestBackendListensForAttributeChanges(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{})
	ctx := context.Background()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, env.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND datname = current_database() AND query LIKE 'LISTEN %'`, attributes.Listener).Scan(&n))
		return n == 1
	}, 10*time.Second, 10*time.Millisecond, "the backend does not listen for attribute changes")
}
