// Package clientip says which address a request came from, for everything
// that limits or records by address (the backend's refused-token limit,
// the web UI's sign-in throttle, both processes' access logs).
//
// The address is the connection's peer, unless the peer is a configured
// trusted proxy (--trusted-proxies): then X-Forwarded-For is walked from the
// right, skipping trusted proxies, and the first untrusted hop is the
// client. The header of an untrusted peer is never read, so a client that
// reaches the server directly cannot choose its address. The walk is
// chi's middleware.ClientIPFromXFF; Trust installs it.
package clientip

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/go-chi/chi/v5/middleware"
)

// ParsePrefixes parses a comma-separated list of CIDR prefixes (a bare
// address is its own /32 or /128), the value of --trusted-proxies.
func ParsePrefixes(list string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("trusted proxy %q: want an address or a CIDR prefix such as 10.0.0.0/8", s)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// Trust returns the middleware that establishes the client address of a
// request arriving through one of the trusted proxies. Without any it
// changes nothing: every request's address is its peer.
func Trust(trusted []netip.Prefix) func(http.Handler) http.Handler {
	if len(trusted) == 0 {
		return func(h http.Handler) http.Handler { return h }
	}
	s := make([]string, len(trusted))
	for i, p := range trusted {
		s[i] = p.String()
	}
	return middleware.ClientIPFromXFF(s...)
}

// Addr is the request's client address: the one Trust established, else
// the connection's peer (a trusted proxy whose header named no untrusted
// hop, or no trusted proxies at all). Invalid only for a peer address that
// does not parse, which net/http does not produce.
func Addr(r *http.Request) netip.Addr {
	if a := middleware.GetClientIPAddr(r.Context()); a.IsValid() {
		return a
	}
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap().WithZone("")
}

// Key is what limits count a client by: its IPv4 address, or the /64 of
// an IPv6 one (one host commonly holds a whole /64).
func Key(r *http.Request) string {
	a := Addr(r)
	if !a.IsValid() {
		return r.RemoteAddr
	}
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return a.String()
}
