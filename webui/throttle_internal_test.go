package webui

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-chi/chi/v5/middleware"
	"github.com/stretchr/testify/require"
)

func TestDelaySchedule(t *testing.T) {
	want := map[int]time.Duration{1: 0, 2: 0, 3: 0, 4: time.Second, 5: 2 * time.Second, 6: 4 * time.Second,
		13: 512 * time.Second, 14: maxDelay, 15: maxDelay, 1000: maxDelay, 1 << 30: maxDelay}
	for n, d := range want {
		require.Equal(t, d, delay(n), "delay(%d)", n)
	}
}

func TestClientAddress(t *testing.T) {
	at := func(remote string) string {
		r := httptest.NewRequest("POST", "/ui/login", nil)
		r.RemoteAddr = remote
		return clientAddress(r)
	}
	require.Equal(t, "192.0.2.7", at("192.0.2.7:4242"))
	require.Equal(t, "192.0.2.7", at("[::ffff:192.0.2.7]:1"), "a mapped address is its IPv4 address")
	require.Equal(t, at("[2001:db8:1:2::1]:1"), at("[2001:db8:1:2:ffff::9]:2"), "one IPv6 /64 is one client")
	require.NotEqual(t, at("[2001:db8:1:2::1]:1"), at("[2001:db8:1:3::1]:1"))
	require.Equal(t, "fe80::/64", at("[fe80::1%eth0]:1"))

	// A trusted-proxy middleware's client IP wins over the peer address;
	// X-Forwarded-For alone is ignored.
	r := httptest.NewRequest("POST", "/ui/login", nil)
	r.RemoteAddr = "10.0.0.1:1"
	r.Header.Set("X-Forwarded-For", "198.51.100.9")
	require.Equal(t, "10.0.0.1", clientAddress(r))
	r.RemoteAddr = "10.0.0.1:1"
	middleware.ClientIPFromXFF("10.0.0.0/8")(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		require.Equal(t, "198.51.100.9", clientAddress(r))
	})).ServeHTTP(httptest.NewRecorder(), r)
}
