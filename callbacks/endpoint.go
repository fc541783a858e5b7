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

// addressKind classifies an IP address for the callback allow-list: "" for
// a public address, a clients.Network* value for an internal one, or
// "forbidden" for addresses nothing may call (unspecified, multicast).
func addressKind(ip netip.Addr) string {
	ip = ip.Unmap()
	switch {
	case ip.IsLoopback():
		return clients.NetworkLoopback
	case ip.IsLinkLocalUnicast():
		return clients.NetworkLinkLocal // includes 169.254.169.254, cloud metadata
	case ip.IsPrivate() || cgnat.Contains(ip):
		return clients.NetworkPrivate
	case ip.IsUnspecified() || ip.IsMulticast() || ip.IsLinkLocalMulticast() || ip.IsInterfaceLocalMulticast():
		return "forbidden"
	}
	return ""
}

var cgnat = netip.MustParsePrefix("100.64.0.0/10")

var kindWords = map[string]string{
	clients.NetworkLoopback: "a loopback", clients.NetworkLinkLocal: "a link-local", clients.NetworkPrivate: "a private",
	"forbidden": "an unroutable",
}

// allowed reports whether a client may reach ip, and why not.
func allowed(ip netip.Addr, networks []string) error {
	kind := addressKind(ip)
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
