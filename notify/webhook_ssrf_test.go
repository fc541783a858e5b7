package notify_test

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/callbacks"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/rebindtest"
	"github.com/omcp/arap/migrations"
	"github.com/omcp/arap/notify"
)

// TestWebhookRefusesATargetRebindToLoopback: a webhook target whose host
// passed the checks when it was created and again before the POST (it
// resolved to a public address) but resolves to loopback when the POST
// dials is refused at dial time: the webhook channel shares the callbacks'
// dialler, so no connection reaches the loopback listener and Send says why.
func TestWebhookRefusesATargetRebindToLoopback(t *testing.T) {
	rebindtest.LocalhostIsLoopback(t)
	ctx := context.Background()
	db := dbtest.New(t)
	jobs, err := river.NewClient(riverpgxv5.New(db), &river.Config{Schema: migrations.RiverSchema})
	require.NoError(t, err)
	dns := &rebindtest.PublicDNS{}
	svc, err := callbacks.NewService(callbacks.Config{DB: db, Jobs: jobs, MasterKey: make([]byte, 32), Resolver: dns,
		StatusEndpoint: func(string) string { return "" }})
	require.NoError(t, err)

	srv, conns := rebindtest.CountingServer(t, http.StatusNoContent)
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	require.NoError(t, err)

	// The ITSM client may post to any https endpoint, but to no internal
	// network.
	c, _, err := clients.NewStore(db).Create(ctx, clients.New{Name: "itsm", Scopes: []string{"decide"}, Kind: "itsm",
		CallbackPrefixes: []string{"https://"}}, "test")
	require.NoError(t, err)
	_, err = svc.RotateSecret(ctx, c.ID, 0, "", "test")
	require.NoError(t, err)
	targets := &callbacks.TargetStore{DB: db, Resolver: dns, Now: time.Now}
	_, err = targets.Create(ctx, "tickets", c.ID, "https://localhost:"+port+"/hook", "test")
	require.NoError(t, err, "creation sees a public address")
	require.NotZero(t, dns.Asked.Load(), "creation resolved through the Resolver seam")

	w := &notify.Webhook{Poster: svc}
	err = w.Send(ctx, notify.Message{To: "tickets", ID: "evt_1.tickets", Payload: []byte(`{}`)})
	require.Zero(t, conns.Load(), "the webhook reached the loopback listener")
	require.ErrorContains(t, err, "a loopback address, which this client is not allowed to call")
}
