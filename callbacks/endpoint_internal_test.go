package callbacks

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/clients"
)

// ianaSpecial is this test's own copy of the IANA IPv4 and IPv6
// Special-Purpose Address Registries (plus multicast), with the class each
// block must get. It is the oracle: an address's expected class is that of
// the most specific block here containing it, public ("") when none does.
var ianaSpecial = []struct{ cidr, kind string }{
	{"0.0.0.0/8", kindForbidden},
	{"10.0.0.0/8", clients.NetworkPrivate},
	{"100.64.0.0/10", clients.NetworkPrivate},
	{"127.0.0.0/8", clients.NetworkLoopback},
	{"169.254.0.0/16", clients.NetworkLinkLocal},
	{"172.16.0.0/12", clients.NetworkPrivate},
	{"192.0.0.0/24", kindForbidden},
	{"192.0.0.0/29", kindForbidden},
	{"192.0.0.8/32", kindForbidden},
	{"192.0.0.9/32", kindForbidden},
	{"192.0.0.10/32", kindForbidden},
	{"192.0.0.170/32", kindForbidden},
	{"192.0.0.171/32", kindForbidden},
	{"192.0.2.0/24", kindForbidden},
	{"192.31.196.0/24", kindForbidden},
	{"192.52.193.0/24", kindForbidden},
	{"192.88.99.0/24", kindForbidden},
	{"192.168.0.0/16", clients.NetworkPrivate},
	{"192.175.48.0/24", kindForbidden},
	{"198.18.0.0/15", kindForbidden},
	{"198.51.100.0/24", kindForbidden},
	{"203.0.113.0/24", kindForbidden},
	{"224.0.0.0/4", kindForbidden},
	{"240.0.0.0/4", kindForbidden},
	{"255.255.255.255/32", kindForbidden},

	{"::/128", kindForbidden},
	{"::/96", kindForbidden},
	{"::1/128", clients.NetworkLoopback},
	{"::ffff:0:0:0/96", kindForbidden},
	{"64:ff9b::/96", kindForbidden},
	{"64:ff9b:1::/48", kindForbidden},
	{"100::/64", kindForbidden},
	{"100:0:0:1::/64", kindForbidden},
	{"2001::/23", kindForbidden},
	{"2001::/32", kindForbidden},
	{"2001:1::1/128", kindForbidden},
	{"2001:1::2/128", kindForbidden},
	{"2001:1::3/128", kindForbidden},
	{"2001:2::/48", kindForbidden},
	{"2001:3::/32", kindForbidden},
	{"2001:4:112::/48", kindForbidden},
	{"2001:20::/28", kindForbidden},
	{"2001:30::/28", kindForbidden},
	{"2001:db8::/32", kindForbidden},
	{"2002::/16", kindForbidden},
	{"2620:4f:8000::/48", kindForbidden},
	{"3fff::/20", kindForbidden},
	{"5f00::/16", kindForbidden},
	{"fc00::/7", clients.NetworkPrivate},
	{"fe80::/10", clients.NetworkLinkLocal},
	{"fec0::/10", clients.NetworkPrivate},
	{"ff00::/8", kindForbidden},
}

// expectedKind is the oracle's class of a.
func expectedKind(a netip.Addr) string {
	a = a.Unmap()
	best, kind := -1, ""
	for _, b := range ianaSpecial {
		p := netip.MustParsePrefix(b.cidr)
		if p.Contains(a) && p.Bits() > best {
			best, kind = p.Bits(), b.kind
		}
	}
	return kind
}

// lastAddr is the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func TestAddressKindCoversEverySpecialPurposeBlock(t *testing.T) {
	// Every block's first and last address, and the addresses just outside
	// it, which are public unless another block holds them.
	var probes []netip.Addr
	for _, b := range ianaSpecial {
		p := netip.MustParsePrefix(b.cidr)
		first, last := p.Masked().Addr(), lastAddr(p)
		probes = append(probes, first, last)
		if prev := first.Prev(); prev.IsValid() {
			probes = append(probes, prev)
		}
		if next := last.Next(); next.IsValid() {
			probes = append(probes, next)
		}
	}
	// Public addresses that must stay reachable, near the edges of what is
	// refused.
	public := []string{
		"1.1.1.1", "8.8.8.8", "9.255.255.255", "11.0.0.0", "100.63.255.255", "100.128.0.0", "172.15.255.255", "172.32.0.0",
		"192.0.1.0", "192.0.3.0", "192.167.255.255", "192.169.0.0", "198.17.255.255", "198.20.0.0", "223.255.255.255",
		"93.184.216.34",
		"2606:4700:4700::1111", "2001:4860:4860::8888", "2001:200::1", "2a00:1450:4001::1", "2003::1", "2001:dc8::1",
		"64:ff9b:0:1::1", "3fff:1000::", "fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "2620:4f:7fff:ffff:ffff:ffff:ffff:ffff", "2620:4f:8001::",
	}
	for _, s := range public {
		a := netip.MustParseAddr(s)
		require.Empty(t, expectedKind(a), "%s is in the test's own table; fix the list", s)
		probes = append(probes, a)
	}
	for _, a := range probes {
		want := expectedKind(a)
		require.Equal(t, want, addressKind(a), "addressKind(%s)", a)
		if a.Is4() {
			// The IPv4-mapped form is the same address.
			mapped := netip.AddrFrom16(a.As16())
			require.Equal(t, want, addressKind(mapped), "addressKind(%s)", mapped)
		} else {
			// A zone changes nothing.
			require.Equal(t, want, addressKind(a.WithZone("eth0")), "addressKind(%s%%eth0)", a)
		}

		// The refusal at dial time (what DNS rebinding meets) agrees: with
		// no networks allowed only public addresses pass; with every class
		// allowed only forbidden ones are refused.
		addr := netip.AddrPortFrom(a, 443).String()
		err := dialControl(nil)("tcp", addr, nil)
		if want == "" {
			require.NoError(t, err, "dial %s", addr)
		} else {
			require.Error(t, err, "dial %s", addr)
		}
		err = dialControl(clients.AllNetworks)("tcp", addr, nil)
		if want == kindForbidden {
			require.ErrorContains(t, err, "no client may call", "dial %s", addr)
		} else {
			require.NoError(t, err, "dial %s", addr)
		}
	}
	require.Equal(t, kindForbidden, addressKind(netip.Addr{}), "the zero address")
}
