package callbacks_test

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/callbacks"
	"github.com/omcp/arap/clients"
)

func TestCheckEndpoint(t *testing.T) {
	ctx := context.Background()
	open := &clients.Client{Name: "pep", CallbackPrefixes: []string{"https://", "http://"}}
	withPrivate := &clients.Client{Name: "pep", CallbackPrefixes: []string{"https://"}, CallbackNetworks: []string{"private", "link-local"}}
	dev := &clients.Client{Name: "dev-pep", CallbackPrefixes: []string{"http://127.0.0.1:"}, CallbackNetworks: []string{"loopback"}}
	cases := []struct {
		name     string
		client   *clients.Client
		endpoint string
		refusal  string
	}{
		{"private address", open, "https://10.0.0.1/cb", "10.0.0.1, a private address"},
		{"cloud metadata", open, "https://169.254.169.254/latest/meta-data", "169.254.169.254, a link-local address"},
		{"loopback", open, "https://127.0.0.1/cb", "a loopback address"},
		{"loopback by name", open, "https://localhost/cb", "a loopback address"},
		{"IPv6 loopback", open, "https://[::1]/cb", "a loopback address"},
		{"IPv4-mapped private", open, "https://[::ffff:192.168.1.1]/cb", "a private address"},
		{"carrier-grade NAT", open, "https://100.64.1.1/cb", "a private address"},
		{"unspecified", withPrivate, "https://0.0.0.0/cb", "no client may call"},
		{"benchmarking", withPrivate, "https://198.18.0.1/cb", "no client may call"},
		{"reserved", withPrivate, "https://240.0.0.1/cb", "no client may call"},
		{"NAT64 of a public address", withPrivate, "https://[64:ff9b::5db8:d822]/cb", "no client may call"},
		{"6to4", withPrivate, "https://[2002:5db8:d822::1]/cb", "no client may call"},
		{"IPv4-mapped loopback", open, "https://[::ffff:127.0.0.1]/cb", "a loopback address"},
		{"plain http to the internet", open, "http://93.184.216.34/cb", "must use https"},
		{"not under a prefix", dev, "http://127.0.0.2:9000/cb", "not under any callback prefix"},
		{"no prefixes at all", &clients.Client{Name: "x"}, "https://pep.example/cb", "no registered callback endpoints"},
		{"credentials", open, "https://user:pw@93.184.216.34/cb", "credentials"},
		{"relative", open, "/cb", "absolute URL"},
		{"unresolvable", open, "https://does-not-exist.invalid/cb", "does not resolve"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := callbacks.CheckEndpoint(ctx, net.DefaultResolver, tc.client, tc.endpoint)
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.refusal)
		})
	}
	// Allowed when the client is configured for it.
	require.NoError(t, callbacks.CheckEndpoint(ctx, net.DefaultResolver, withPrivate, "https://10.0.0.1/cb"))
	require.NoError(t, callbacks.CheckEndpoint(ctx, net.DefaultResolver, withPrivate, "https://169.254.169.254/x"))
	require.NoError(t, callbacks.CheckEndpoint(ctx, net.DefaultResolver, dev, "http://127.0.0.1:8481/callbacks"))
	require.NoError(t, callbacks.CheckEndpoint(ctx, net.DefaultResolver, open, "https://93.184.216.34/cb"))
}
