package webui_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/netip"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dev"
)

// browserAt is a browser whose connections come from the loopback address
// ip (all of 127/8 is local on Linux; the contract proxy in front of the
// backend dials it from the same address, so the backend sees that address);
// jar, when given, is shared with another browser (the same person's browser
// on another network).
func browserAt(t *testing.T, env *backendtest.Env, ip string, jar http.CookieJar) *browser {
	if jar == nil {
		jar, _ = cookiejar.New(nil)
	}
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	tr := &http.Transport{DialContext: d.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &browser{t: t, base: env.URL, c: &http.Client{Jar: jar, Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (b *browser) signOut() {
	b.t.Helper()
	p := b.post("/ui/logout", url.Values{"csrf": {csrf(b.t, b.get("/ui/"))}})
	require.Equal(b.t, http.StatusSeeOther, p.status)
}

// Failed sign-ins slow only the client that made them: an attacker failing
// from one address, and then from many, does not stop the real user signing
// in from another address, nor from the attacker's own address in a browser
// that has signed in before.
func TestFailedSignInsSlowOnlyTheirClient(t *testing.T) {
	clock := newClock()
	env := backendtest.Start(t, backendtest.Options{Now: clock.Now})
	checks := env.Backend.Directory().PasswordChecks

	// bob's own browser signs in once (from B) and so becomes known for bob.
	ownJar, _ := cookiejar.New(nil)
	own := browserAt(t, env, "127.0.0.2", ownJar)
	require.Equal(t, http.StatusSeeOther, own.signIn("bob", dev.Password).status)
	own.signOut()

	// The attacker at A: three free failures, then each failure makes the
	// next attempt wait longer, and attempts inside the wait are refused
	// without a password check, even with the right password.
	attacker := browserAt(t, env, "127.0.0.3", nil)
	before := checks()
	for i := 0; i < 3; i++ {
		require.Equal(t, http.StatusUnauthorized, attacker.signIn("bob", "guess").status)
	}
	for _, wait := range []string{"1 second", "2 seconds", "4 seconds", "8 seconds"} {
		p := attacker.signIn("bob", "guess")
		require.Equal(t, http.StatusUnauthorized, p.status)
		require.Contains(t, p.body, "Wait "+wait+" before trying again.")
		for i := 0; i < 3; i++ {
			p = attacker.signIn("bob", dev.Password)
			require.Equal(t, http.StatusTooManyRequests, p.status)
			require.Contains(t, p.body, "try again in "+wait)
		}
		d, err := time.ParseDuration(p.header.Get("Retry-After") + "s")
		require.NoError(t, err)
		clock.Advance(d)
	}
	require.Contains(t, attacker.signIn("bob", "guess").body, "Wait 16 seconds")
	require.Equal(t, before+8, checks(), "only admitted attempts check a password")

	// While the attacker waits, bob signs in from another address, in a
	// browser that never signed in; the attacker still waits.
	require.Equal(t, http.StatusSeeOther, browserAt(t, env, "127.0.0.4", nil).signIn("bob", dev.Password).status)
	require.Equal(t, http.StatusTooManyRequests, attacker.signIn("bob", dev.Password).status)

	// The attacker now spreads guesses over many addresses until the
	// account's budget for unknown browsers is spent...
	for i := 10; ; i++ {
		require.Less(t, i, 60, "the account-wide bound never refused")
		p := browserAt(t, env, fmt.Sprintf("127.0.1.%d", i), nil).signIn("bob", "guess")
		if p.status == http.StatusTooManyRequests {
			require.Contains(t, p.body, "from browsers it has not used before")
			break
		}
		require.Equal(t, http.StatusUnauthorized, p.status)
	}
	// ...which refuses unknown browsers anywhere, including one that forges
	// a device cookie...
	require.Equal(t, http.StatusTooManyRequests, browserAt(t, env, "127.0.0.5", nil).signIn("bob", dev.Password).status)
	forger := browserAt(t, env, "127.0.0.6", nil)
	forger.c.Jar.SetCookies(mustURL(t, forger.base+"/ui/"), []*http.Cookie{{Name: "arap_device", Value: "made-up"}})
	require.Equal(t, http.StatusTooManyRequests, forger.signIn("bob", dev.Password).status)
	// ...and carries no weight for anyone else's account.
	require.Equal(t, http.StatusSeeOther, browserAt(t, env, "127.0.0.5", nil).signIn("carol", dev.Password).status)

	// bob's own browser signs in from his usual address, and from the
	// attacker's: neither the attacker's delays nor the spent budget apply.
	require.Equal(t, http.StatusSeeOther, own.signIn("bob", dev.Password).status)
	own.signOut()
	atA := browserAt(t, env, "127.0.0.3", ownJar)
	p := atA.signIn("bob", dev.Password)
	require.Equal(t, http.StatusSeeOther, p.status, "%s", p.body)
	require.Equal(t, 200, atA.get("/ui/").status)

	// A known browser that fails is slowed too, by its own count.
	atA.signOut()
	for i := 0; i < 3; i++ {
		require.Equal(t, http.StatusUnauthorized, atA.signIn("bob", "typo").status)
	}
	require.Contains(t, atA.signIn("bob", "typo").body, "Wait 1 second")
	require.Equal(t, http.StatusTooManyRequests, atA.signIn("bob", dev.Password).status)
}

// Whatever the number of addresses, and however concurrent the attempts,
// browsers unknown for an account get at most accountBurst password checks
// per window, then one per refill interval.
func TestAccountGuessRateIsBounded(t *testing.T) {
	const burst, interval = 10, 90 * time.Second // webui's accountBurst, accountWindow/accountBurst
	clock := newClock()
	env := backendtest.Start(t, backendtest.Options{Now: clock.Now})
	checks := env.Backend.Directory().PasswordChecks
	before := checks()

	// 40 addresses, 3 attempts each (within each address's free attempts),
	// all at once, each from its own browser.
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	for i := 1; i <= 40; i++ {
		for j := 0; j < 3; j++ {
			b := browserAt(t, env, fmt.Sprintf("127.0.2.%d", i), nil)
			form := url.Values{"csrf": {csrf(t, b.get("/ui/login"))}, "username": {"carol"}, "password": {fmt.Sprintf("guess-%d", j)}}
			wg.Go(func() {
				status := 0 // a transport error
				resp, err := b.c.PostForm(b.base+"/ui/login", form)
				if err == nil {
					status = resp.StatusCode
					_ = resp.Body.Close()
				}
				mu.Lock()
				statuses[status]++
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	require.Equal(t, uint64(burst), checks()-before, "password checks")
	require.Equal(t, map[int]int{http.StatusUnauthorized: burst, http.StatusTooManyRequests: 120 - burst}, statuses)

	// One check comes back per interval, not more.
	clock.Advance(interval)
	fresh := func(i int) int {
		return browserAt(t, env, fmt.Sprintf("127.0.3.%d", i), nil).signIn("carol", "guess").status
	}
	require.Equal(t, http.StatusUnauthorized, fresh(1))
	require.Equal(t, http.StatusTooManyRequests, fresh(2))
	require.Equal(t, uint64(burst+1), checks()-before)

	// A success gives its check back: the real user signing in from new
	// browsers does not spend the budget.
	clock.Advance(interval)
	for i := 3; i < 3+2*burst; i++ {
		require.Equal(t, http.StatusSeeOther, browserAt(t, env, fmt.Sprintf("127.0.3.%d", i), nil).signIn("carol", dev.Password).status)
	}
	require.Equal(t, http.StatusUnauthorized, fresh(100), "the budget has its one check still")

	var rows int
	require.NoError(t, env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM arap.ui_devices WHERE user_name = 'carol'`).Scan(&rows))
	require.Equal(t, 2*burst, rows, "each successful browser is known for the account")
}

// forwardedFor sets X-Forwarded-For on every request of b to what next
// returns, as a client forging the header (or a proxy writing it) would.
type forwardedFor struct {
	next func() string
	rt   http.RoundTripper
}

func (f forwardedFor) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Forwarded-For", f.next())
	return f.rt.RoundTrip(r)
}

func (b *browser) forwarding(next func() string) *browser {
	b.c.Transport = forwardedFor{next: next, rt: b.c.Transport}
	return b
}

// TestSpoofedForwardedForIgnored: the sign-in throttle counts a client by
// its connection's address unless that is a trusted proxy. An attacker
// connecting directly and writing a new X-Forwarded-For on every attempt is
// still throttled as one client; through a trusted proxy, the header
// decides (two clients behind one proxy are throttled apart), and a
// multi-hop chain names the first untrusted hop. (The test backend's
// contract proxy dials from the browser's own address and appends it to
// X-Forwarded-For, as a plain reverse proxy does.)
func TestSpoofedForwardedForIgnored(t *testing.T) {
	clock := newClock()
	proxy := netip.MustParsePrefix("127.0.0.9/32")
	env := backendtest.Start(t, backendtest.Options{Now: clock.Now, TrustedProxies: []netip.Prefix{proxy}})

	n := 0
	attacker := browserAt(t, env, "127.0.0.3", nil).forwarding(func() string {
		n++
		return fmt.Sprintf("198.51.100.%d", n) // a new "client" every request, pages included
	})
	for i := 0; i < 3; i++ {
		require.Equal(t, http.StatusUnauthorized, attacker.signIn("bob", "guess").status)
	}
	require.Contains(t, attacker.signIn("bob", "guess").body, "Wait 1 second")
	require.Equal(t, http.StatusTooManyRequests, attacker.signIn("bob", dev.Password).status, "rotating X-Forwarded-For does not escape the throttle")

	// Behind the trusted proxy, the client named in the header fails and
	// waits; another client behind the same proxy signs in.
	behind := func(client string) *browser {
		return browserAt(t, env, "127.0.0.9", nil).forwarding(func() string { return client })
	}
	x := behind("203.0.113.7")
	for i := 0; i < 3; i++ {
		require.Equal(t, http.StatusUnauthorized, x.signIn("carol", "guess").status)
	}
	require.Contains(t, x.signIn("carol", "guess").body, "Wait 1 second")
	require.Equal(t, http.StatusTooManyRequests, x.signIn("carol", dev.Password).status)
	require.Equal(t, http.StatusTooManyRequests, behind("203.0.113.7").signIn("carol", dev.Password).status, "the same client in a fresh browser")
	require.Equal(t, http.StatusSeeOther, behind("203.0.113.8").signIn("carol", dev.Password).status, "another client behind the proxy")
	// A chain: the client forged a hop, then a trusted inner proxy
	// forwarded; the first untrusted hop from the right is the client.
	require.Equal(t, http.StatusTooManyRequests, behind("10.10.10.10, 203.0.113.7, 127.0.0.9").signIn("carol", dev.Password).status)
	require.Equal(t, http.StatusSeeOther, behind("203.0.113.7, 203.0.113.9, 127.0.0.9").signIn("carol", dev.Password).status)
}
