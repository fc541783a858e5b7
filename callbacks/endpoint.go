package callbacks

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/omcp/arap/clients"
)

// special lists every IANA special-purpose block (the IPv4 and IPv6
// Special-Purpose Address Registries, RFC 6890 and later) plus multicast,
// with the network class a client must be allowed to reach it. Blocks with
// no class of their own (documentation, benchmarking, reserved, anycast
// relays, translation prefixes) are "forbidden": nothing may call them.
// NAT64 prefixes are forbidden rather than classified by their embedded
// IPv4 address, because the translator, not us, decides where they lead.
// The most specific block wins (::1 inside ::/96).
var special = func() []block {
	table := []struct{ cidr, kind string }{
		// IPv4
		{"0.0.0.0/8", kindForbidden},              // "this network"
		{"10.0.0.0/8", clients.NetworkPrivate},    // RFC 1918
		{"100.64.0.0/10", clients.NetworkPrivate}, // shared address space (carrier-grade NAT)
		{"127.0.0.0/8", clients.NetworkLoopback},
		{"169.254.0.0/16", clients.NetworkLinkLocal}, // includes 169.254.169.254, cloud metadata
		{"172.16.0.0/12", clients.NetworkPrivate},
		{"192.0.0.0/24", kindForbidden},    // IETF protocol assignments (DS-Lite, NAT64 discovery, anycast)
		{"192.0.2.0/24", kindForbidden},    // TEST-NET-1
		{"192.31.196.0/24", kindForbidden}, // AS112-v4
		{"192.52.193.0/24", kindForbidden}, // AMT
		{"192.88.99.0/24", kindForbidden},  // deprecated 6to4 relay anycast
		{"192.168.0.0/16", clients.NetworkPrivate},
		{"192.175.48.0/24", kindForbidden},    // direct delegation AS112
		{"198.18.0.0/15", kindForbidden},      // benchmarking
		{"198.51.100.0/24", kindForbidden},    // TEST-NET-2
		{"203.0.113.0/24", kindForbidden},     // TEST-NET-3
		{"224.0.0.0/4", kindForbidden},        // multicast
		{"240.0.0.0/4", kindForbidden},        // reserved
		{"255.255.255.255/32", kindForbidden}, // limited broadcast

		// IPv6 (IPv4-mapped ::ffff:0:0/96 is classified by its IPv4 address)
		{"::/96", kindForbidden}, // unspecified and deprecated IPv4-compatible
		{"::1/128", clients.NetworkLoopback},
		{"::ffff:0:0:0/96", kindForbidden},   // IPv4-translated (SIIT)
		{"64:ff9b::/96", kindForbidden},      // NAT64 well-known prefix
		{"64:ff9b:1::/48", kindForbidden},    // NAT64 local-use
		{"100::/64", kindForbidden},          // discard-only
		{"100:0:0:1::/64", kindForbidden},    // dummy prefix
		{"2001::/23", kindForbidden},         // IETF protocol assignments (Teredo, benchmarking, ORCHID, anycast)
		{"2001:db8::/32", kindForbidden},     // documentation
		{"2002::/16", kindForbidden},         // 6to4
		{"2620:4f:8000::/48", kindForbidden}, // direct delegation AS112
		{"3fff::/20", kindForbidden},         // documentation
		{"5f00::/16", kindForbidden},         // segment routing (SRv6) SIDs
		{"fc00::/7", clients.NetworkPrivate}, // unique local
		{"fe80::/10", clients.NetworkLinkLocal},
		{"fec0::/10", clients.NetworkPrivate}, // deprecated site-local
		{"ff00::/8", kindForbidden},           // multicast
	}
	b := make([]block, len(table))
	for i, t := range table {
		b[i] = block{netip.MustParsePrefix(t.cidr), t.kind}
	}
	// Most specific first, so the first match is the right one.
	slices.SortStableFunc(b, func(x, y block) int { return y.prefix.Bits() - x.prefix.Bits() })
	return b
}()

type block struct {
	prefix netip.Prefix
	kind   string
}

// kindForbidden marks addresses no client may call.
const kindForbidden = "forbidden"

// addressKind classifies an IP address for the callback allow-list: "" for
// a public address, a clients.Network* value for an internal one, or
// kindForbidden for addresses nothing may call (see special).
func addressKind(ip netip.Addr) string {
	// A zone never makes an address public (and Prefix.Contains ignores
	// zoned addresses), so it is dropped before matching.
	ip = ip.WithZone("").Unmap()
	if !ip.IsValid() {
		return kindForbidden
	}
	for _, b := range special {
		if b.prefix.Contains(ip) {
			return b.kind
		}
	}
	return ""
}

var kindWords = map[string]string{
	clients.NetworkLoopback: "a loopback", clients.NetworkLinkLocal: "a link-local", clients.NetworkPrivate: "a private",
}

// allowed reports whether a client may reach ip, and why not.
func allowed(ip netip.Addr, networks []string) error {
	kind := addressKind(ip)
	if kind == kindForbidden {
		return fmt.Errorf("it resolves to %s, a special-purpose (reserved, documentation, translation or multicast) address, which no client may call", ip)
	}
	if kind == "" || slices.Contains(networks, kind) {
		return nil
	}
	return fmt.Errorf("it resolves to %s, %s address, which this client is not allowed to call", ip, kindWords[kind])
}

// Resolver looks up host addresses (net.DefaultResolver in production).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// CheckEndpoint decides whether client c may register endpoint as a callback
// and returns the refusal's reason otherwise: the URL must start with one of
// the client's registered prefixes, use https (http only for a client allowed
// to call loopback, to a loopback address), and every address the host
// resolves to must be public or in the client's allowed networks.
func CheckEndpoint(ctx context.Context, r Resolver, c *clients.Client, endpoint string) error {
	u, err := url.Parse(endpoint)
	if err != nil || !u.IsAbs() || u.Host == "" {
		return errors.New("the callback endpoint must be an absolute URL")
	}
	if u.User != nil || u.Fragment != "" {
		return errors.New("the callback endpoint may not carry credentials or a fragment")
	}
	if !slices.ContainsFunc(c.CallbackPrefixes, func(p string) bool { return strings.HasPrefix(endpoint, p) }) {
		if len(c.CallbackPrefixes) == 0 {
			return fmt.Errorf("client %q has no registered callback endpoints; an operator can allow some (arapctl clients create --callback-prefix)", c.Name)
		}
		return fmt.Errorf("the endpoint is not under any callback prefix registered for client %q", c.Name)
	}
	if u.Scheme != "https" && u.Scheme != "http" {
		return errors.New("the callback endpoint must use https")
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	ips, err := r.LookupNetIP(ctx, "ip", u.Hostname())
	if err != nil || len(ips) == 0 {
		return fmt.Errorf("the callback host %q does not resolve", u.Hostname())
	}
	for _, ip := range ips {
		if err := allowed(ip, c.CallbackNetworks); err != nil {
			return fmt.Errorf("callback endpoint refused: %w", err)
		}
		if u.Scheme == "http" && !(addressKind(ip) == clients.NetworkLoopback && slices.Contains(c.CallbackNetworks, clients.NetworkLoopback)) {
			return errors.New("the callback endpoint must use https (plain http is allowed only to loopback, for clients allowed to call it)")
		}
	}
	return nil
}

// dialControl re-checks every address actually dialled, so a name that
// resolved to a public address at submission cannot be rebound to an
// internal one at delivery.
func dialControl(networks []string) func(network, address string, _ syscall.RawConn) error {
	return func(network, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return fmt.Errorf("callbacks: unexpected address %q", address)
		}
		return allowed(ap.Addr(), networks)
	}
}
