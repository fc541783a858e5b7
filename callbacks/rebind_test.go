package callbacks_test

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/callbacks"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/rebindtest"
	"github.com/omcp/arap/migrations"
	"github.com/omcp/arap/requests"
)

// TestDeliveryRefusesANameRebindToLoopback: a callback whose host passed
// the submission check (it resolved to a public address) but resolves to
// loopback when the delivery dials is refused at dial time: no connection
// reaches the loopback listener, and the attempt records why.
func TestDeliveryRefusesANameRebindToLoopback(t *testing.T) {
	rebindtest.LocalhostIsLoopback(t)
	ctx := context.Background()
	db := dbtest.New(t)
	// Insert-only: no worker runs the job; the test makes the attempt.
	jobs, err := river.NewClient(riverpgxv5.New(db), &river.Config{Schema: migrations.RiverSchema})
	require.NoError(t, err)
	dns := &rebindtest.PublicDNS{}
	svc, err := callbacks.NewService(callbacks.Config{DB: db, Jobs: jobs, MasterKey: make([]byte, 32), Resolver: dns,
		StatusEndpoint: func(id string) string { return "https://arap.example/access/v1/requests/" + id },
		Schedule:       []time.Duration{}, // the first failed attempt is the last
	})
	require.NoError(t, err)
	srv, conns := rebindtest.CountingServer(t, http.StatusOK)
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	require.NoError(t, err)

	// A client allowed any https endpoint, but no internal network.
	c, _, err := clients.NewStore(db).Create(ctx, clients.New{Name: "pep", Scopes: []string{"request"}, Kind: "automation",
		CallbackPrefixes: []string{"https://"}}, "test")
	require.NoError(t, err)
	_, err = svc.RotateSecret(ctx, c.ID, 0, "", "test")
	require.NoError(t, err)

	cb := &authzen.Callback{Endpoint: "https://localhost:" + port + "/cb"}
	require.NoError(t, svc.CheckCallback(ctx, c.ID, cb), "registration sees a public address")
	require.NotZero(t, dns.Asked.Load(), "registration resolved through the Resolver seam")

	// The request ends; its delivery is recorded as the backend records it.
	now := time.Now()
	r := &requests.Request{ID: "req_rebind", ClientID: c.ID, Status: requests.Approved, ExpiresAt: now.Add(time.Hour), Callback: cb}
	_, err = db.Exec(ctx, `INSERT INTO arap.requests (id, client_id, status, rule, subject, resource, action, denial, evaluation_id,
		binding_hash, binding_context_members, expires_at, created_at, updated_at, terminal_at)
		VALUES ($1, $2, 'approved', 'r', '{}', '{}', '{}', '{}', 'e', 'h', '{}', $3, $4, $4, $4)`, r.ID, c.ID, r.ExpiresAt, now)
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return svc.OnTerminal(ctx, tx, []*requests.Request{r}) }))
	ds, err := svc.Deliveries(ctx, r.ID)
	require.NoError(t, err)
	require.Len(t, ds, 1)

	next, err := svc.Attempt(ctx, ds[0].ID)
	require.NoError(t, err)
	require.True(t, next.IsZero(), "no retry is scheduled")
	require.Zero(t, conns.Load(), "the delivery reached the loopback listener")

	ds, err = svc.Deliveries(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, callbacks.Failed, ds[0].Status)
	require.Len(t, ds[0].Attempts, 1)
	require.Nil(t, ds[0].Attempts[0].StatusCode, "nothing answered")
	require.Contains(t, ds[0].Attempts[0].Error, "a loopback address, which this client is not allowed to call")
}
