package callbacks_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/callbacks"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/migrations"
)

// TestCheckCallbackRemembersAbleClients: a client seen with a live webhook
// secret is remembered for clients.CacheTTL, and no longer; one without is
// not remembered, so its new secret counts at once.
func TestCheckCallbackRemembersAbleClients(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	jobs, err := river.NewClient(riverpgxv5.New(db), &river.Config{Schema: migrations.RiverSchema})
	require.NoError(t, err)
	var offset atomic.Int64
	svc, err := callbacks.NewService(callbacks.Config{DB: db, Jobs: jobs, MasterKey: make([]byte, 32),
		StatusEndpoint: func(string) string { return "" }, Now: func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }})
	require.NoError(t, err)
	c, _, err := clients.NewStore(db).Create(ctx, clients.New{Name: "pep", Scopes: []string{"request"}, Kind: "automation",
		CallbackPrefixes: []string{"http://127.0.0.1:"}, CallbackNetworks: []string{clients.NetworkLoopback}}, "test")
	require.NoError(t, err)
	cb := &authzen.Callback{Endpoint: "http://127.0.0.1:9/cb"}

	require.ErrorContains(t, svc.CheckCallback(ctx, c.ID, cb), "has no webhook secret")
	require.ErrorContains(t, svc.CheckCallback(ctx, c.ID, cb), "has no webhook secret", "a client without one is not remembered as able")
	_, err = svc.RotateSecret(ctx, c.ID, 0, "", "test")
	require.NoError(t, err)
	require.NoError(t, svc.CheckCallback(ctx, c.ID, cb), "a refusal is not remembered: the new secret counts at once")

	_, err = db.Exec(ctx, `UPDATE arap.webhook_secrets SET expires_at = now() - interval '1 second' WHERE client_id = $1`, c.ID)
	require.NoError(t, err)
	require.NoError(t, svc.CheckCallback(ctx, c.ID, cb), "remembered within clients.CacheTTL")
	offset.Store(int64(clients.CacheTTL))
	require.ErrorContains(t, svc.CheckCallback(ctx, c.ID, cb), "has no webhook secret", "read again once remembered for clients.CacheTTL")
	require.ErrorContains(t, svc.CheckCallback(ctx, c.ID, &authzen.Callback{Endpoint: "http://10.0.0.1/cb"}), "not under any callback prefix",
		"the allow-list is checked whatever is remembered")
}
