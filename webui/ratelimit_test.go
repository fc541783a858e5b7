package webui_test

import (
	"fmt"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/webui"
)

// TestSignInAttemptsLimitedPerAddressAcrossReplicas: sign-in attempts from
// one address are counted for all replicas together; past the budget the
// form answers 429 with Retry-After, whichever replica gets it.
func TestSignInAttemptsLimitedPerAddressAcrossReplicas(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{})
	other := backendtest.Start(t, backendtest.Options{Join: env})
	browsers := []*browser{newBrowser(t, env.URL), newBrowser(t, other.URL)}
	attempt := func(b *browser, i int) page {
		// A different unknown name each time: no account lock-out is
		// involved, only the address's budget.
		return b.post("/ui/login", url.Values{"csrf": {csrf(t, b.get("/ui/login"))}, "username": {fmt.Sprintf("nobody-%d", i)}, "password": {"x"}})
	}
	for i := range webui.LoginsPerMinute {
		require.Equal(t, 401, attempt(browsers[i%2], i).status, "attempt %d", i)
	}
	for i, b := range browsers {
		p := attempt(b, webui.LoginsPerMinute+i)
		require.Equal(t, 429, p.status)
		require.NotEmpty(t, p.header.Get("Retry-After"))
		require.Contains(t, p.body, "Too many sign-in attempts")
	}
}
