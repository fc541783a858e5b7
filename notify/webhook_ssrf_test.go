package notify_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/callbacks"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/migrations"
	"github.com/omcp/arap/notify"
)

// publicDNS is a rebinding attacker's DNS as the checks see it: every name
// resolves to a public address. The webhook's dialler does not ask it; it
// resolves through the system, where "localhost" is loopback.
type publicDNS struct{ asked atomic.Int32 }

func (d *publicDNS) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	d.asked.Add(1)
	return []netip.Addr{netip.MustParseAddr("93.184.216.34")}, nil
}

// TestWebhookRefusesATargetRebindToLoopback: a webhook target whose host
// passed the checks when it was created and again before the POST (it
// resolved to a public address) but resolves to loopback when the POST
// dials is refused at dial time: the webhook channel shares the callbacks'
// dialler, so no connection reaches the loopback listener and Send says why.
func TestWebhookRefusesATargetRebindToLoopback(t *testing.T) {
	ips, err := net.DefaultResolver.LookupNetIP(context.Background(), "ip", "localhost")
	require.NoError(t, err, "the test needs the system to resolve localhost")
	for _, ip := range ips {
		require.True(t, ip.Unmap().IsLoopback(), "the system resolves localhost to %s; the test needs loopback", ip)
	}
	ctx := context.Background()
	db := dbtest.New(t)
	jobs, err := river.NewClient(riverpgxv5.New(db), &river.Config{Schema: migrations.RiverSchema})
	require.NoError(t, err)
	dns := &publicDNS{}
	svc, err := callbacks.NewService(callbacks.Config{DB: db, Jobs: jobs, MasterKey: make([]byte, 32), Resolver: dns,
		StatusEndpoint: func(string) string { return "" }})
	require.NoError(t, err)

	// A real server on loopback, counting connections as it accepts them
	// (before reading anything, so the count is final once Send returns).
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
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
	require.NotZero(t, dns.asked.Load(), "creation resolved through the Resolver seam")

	w := &notify.Webhook{Poster: svc}
	err = w.Send(ctx, notify.Message{To: "tickets", ID: "evt_1.tickets", Payload: []byte(`{}`)})
	require.Zero(t, conns.Load(), "the webhook reached the loopback listener")
	require.ErrorContains(t, err, "a loopback address, which this client is not allowed to call")
}
