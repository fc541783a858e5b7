// Package rebindtest holds what the DNS-rebinding tests of callbacks and
// notify share: the attacker's DNS as the checks see it, the system's
// localhost as the dialler sees it, and a loopback server that counts the
// connections it accepts.
package rebindtest

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// PublicDNS is a rebinding attacker's DNS as the registration-time and
// send-time checks see it: every name resolves to a public address. The
// dialler does not ask it; it resolves through the system, where
// "localhost" is loopback.
type PublicDNS struct{ Asked atomic.Int32 }

func (d *PublicDNS) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	d.Asked.Add(1)
	return []netip.Addr{netip.MustParseAddr("93.184.216.34")}, nil
}

// LocalhostIsLoopback requires that the system resolves "localhost" to
// loopback addresses only, which the rebinding tests rely on.
func LocalhostIsLoopback(t *testing.T) {
	t.Helper()
	ips, err := net.DefaultResolver.LookupNetIP(context.Background(), "ip", "localhost")
	require.NoError(t, err, "the test needs the system to resolve localhost")
	require.NotEmpty(t, ips)
	for _, ip := range ips {
		require.True(t, ip.Unmap().IsLoopback(), "the system resolves localhost to %s; the test needs loopback", ip)
	}
}

// CountingServer is a real server on loopback answering status to
// everything and counting the connections it accepts; the count is taken
// before anything is read, so it is final once the dialler's attempt has
// ended.
func CountingServer(t *testing.T, status int) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(status) }))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}
