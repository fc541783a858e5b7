package clientip_test

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/clientip"
)

// through returns the key of a request from peer with the given
// X-Forwarded-For values, through Trust(trusted).
func through(t *testing.T, trusted, peer string, xff ...string) string {
	t.Helper()
	prefixes, err := clientip.ParsePrefixes(trusted)
	require.NoError(t, err)
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = peer
	for _, v := range xff {
		r.Header.Add("X-Forwarded-For", v)
	}
	var got string
	clientip.Trust(prefixes)(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		got = clientip.Key(r)
	})).ServeHTTP(httptest.NewRecorder(), r)
	return got
}

func TestKey(t *testing.T) {
	for addr, want := range map[string]string{
		"192.0.2.7:4711":                   "192.0.2.7",
		"[2001:db8:1:2:3:4:5:6]:443":       "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff:4:5:6]:443":    "2001:db8:1:2::/64",
		"[::ffff:192.0.2.7]:80":            "192.0.2.7",
		"[fe80::1%eth0]:80":                "fe80::/64",
		"not an address":                   "not an address",
		"[2001:db8:1:3:3:4:5:6]:443":       "2001:db8:1:3::/64",
		"[2001:0db8:0000:0000:0:0:0:1]:22": "2001:db8::/64",
	} {
		require.Equal(t, want, through(t, "", addr), addr)
	}
}

// TestUntrustedPeerHeaderIgnored: a peer that is not a trusted proxy is the
// client, whatever X-Forwarded-For it sends; with no trusted proxies at all
// the header is never read.
func TestUntrustedPeerHeaderIgnored(t *testing.T) {
	require.Equal(t, "203.0.113.5", through(t, "", "203.0.113.5:1", "198.51.100.9"))
	require.Equal(t, "203.0.113.5", through(t, "10.0.0.0/8", "203.0.113.5:1", "198.51.100.9"))
	require.Equal(t, "203.0.113.5", through(t, "10.0.0.0/8", "203.0.113.5:1", "198.51.100.9, 10.0.0.1"), "trusted-looking hops in the header do not make the peer trusted")
}

// TestTrustedProxyHeaderUsed: through a trusted proxy the client is the
// rightmost untrusted hop of X-Forwarded-For; hops the client wrote itself
// (left of it) are not believed.
func TestTrustedProxyHeaderUsed(t *testing.T) {
	require.Equal(t, "198.51.100.9", through(t, "10.0.0.0/8", "10.0.0.1:1", "198.51.100.9"))
	// Two proxies: the edge 10.1.2.3 appended the client, the inner one
	// (the peer) appended the edge.
	require.Equal(t, "198.51.100.9", through(t, "10.0.0.0/8", "10.0.0.1:1", "198.51.100.9, 10.1.2.3"))
	// The client forged a first hop; the edge appended the client's real address.
	require.Equal(t, "198.51.100.9", through(t, "10.0.0.0/8", "10.0.0.1:1", "1.2.3.4, 198.51.100.9, 10.1.2.3"))
	// The same chain over several header lines.
	require.Equal(t, "198.51.100.9", through(t, "10.0.0.0/8", "10.0.0.1:1", "1.2.3.4", "198.51.100.9, 10.1.2.3"))
	// Trusted proxies given as single addresses, IPv6 clients by /64.
	require.Equal(t, "2001:db8:1:2::/64", through(t, "192.0.2.1, ::1", "[::1]:1", "2001:db8:1:2::7, 192.0.2.1"))
	// A chain of trusted hops only, or none: the proxy itself.
	require.Equal(t, "10.0.0.1", through(t, "10.0.0.0/8", "10.0.0.1:1", "10.9.9.9"))
	require.Equal(t, "10.0.0.1", through(t, "10.0.0.0/8", "10.0.0.1:1"))
	// Garbage to the right of the client: nothing left of it is believed.
	require.Equal(t, "10.0.0.1", through(t, "10.0.0.0/8", "10.0.0.1:1", "198.51.100.9, junk"))
}

func TestParsePrefixes(t *testing.T) {
	p, err := clientip.ParsePrefixes(" 10.0.0.0/8 ,192.0.2.1,, 2001:db8::/32, ::ffff:192.0.2.9")
	require.NoError(t, err)
	require.Equal(t, "[10.0.0.0/8 192.0.2.1/32 2001:db8::/32 192.0.2.9/32]", fmtPrefixes(p))
	_, err = clientip.ParsePrefixes("10.0.0.0/8, proxy.local")
	require.EqualError(t, err, `trusted proxy "proxy.local": want an address or a CIDR prefix such as 10.0.0.0/8`)
	p, err = clientip.ParsePrefixes("")
	require.NoError(t, err)
	require.Empty(t, p)
}

func fmtPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return "[" + strings.Join(s, " ") + "]"
}
