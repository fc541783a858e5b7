package arap_test

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
)

// TestDatabaseDown: while PostgreSQL is stopped (fast, then as a crash),
// the API answers 503 unavailable with Retry-After (problem+json; the
// evaluation endpoint AuthZEN's plain text), the web UI a plain 503 page,
// /readyz 503; once it is back, the same requests succeed again. Through
// the contract proxy, so the 503s are the documented ones.
func TestDatabaseDown(t *testing.T) {
	db := dbtest.NewPrivate(t)
	env := backendtest.Start(t, backendtest.Options{DatabaseURL: db.URL})
	pep := api{t: t, base: env.URL, token: dev.PEPToken}
	itsm := api{t: t, base: env.URL, token: dev.ITSMToken}
	id := env.Submit(t, wireCall(50000))
	status := "/access/v1/requests/" + id
	require.Equal(t, 200, pep.do("GET", status, nil).status)
	ui := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	uiGet := func() *http.Response {
		req, err := http.NewRequest("GET", env.URL+"/ui/", nil)
		require.NoError(t, err)
		req.AddCookie(&http.Cookie{Name: "arap_session", Value: "some-session"})
		resp, err := ui.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	require.Equal(t, http.StatusSeeOther, uiGet().StatusCode, "an unknown session is sent to sign in")

	for _, immediate := range []bool{false, true} {
		db.Stop(t, immediate)

		m := pep.do("GET", status, nil).problem(t, 503, authzen.ProblemUnavailable)
		require.Equal(t, "the database is unavailable; retry after 2 seconds", m["detail"])
		r := pep.do("GET", status, nil)
		require.Equal(t, "2", r.header.Get("Retry-After"))
		// An evaluation needs no database of its own: it is answered until
		// the client's batch of rate-limit units is spent (at most 100);
		// the next, which must be counted, is refused.
		for range 200 {
			if r = pep.do("POST", "/access/v1/evaluation", wireCall(1)); r.status != 200 {
				break
			}
		}
		require.Equal(t, 503, r.status, "%s", r.body)
		require.Equal(t, "2", r.header.Get("Retry-After"))
		require.Contains(t, string(r.body), "the database is unavailable; retry after 2 seconds")
		require.True(t, strings.HasPrefix(r.header.Get("Content-Type"), "text/plain"), "AuthZEN's plain error")
		r = itsm.do("GET", "/v1/requests", nil)
		r.problem(t, 503, authzen.ProblemUnavailable)
		require.Equal(t, "2", r.header.Get("Retry-After"))

		resp := uiGet()
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "a session that cannot be read is not a signed-out one")
		require.Equal(t, "2", resp.Header.Get("Retry-After"))
		body, _ := io.ReadAll(resp.Body)
		require.Contains(t, string(body), "temporarily unavailable")

		// Signing in says so too (the limit of attempts is counted in the
		// database; so is the account).
		form := url.Values{"username": {"alice"}, "password": {"x"}, "csrf": {"tok"}}
		req, err := http.NewRequest("POST", env.URL+"/ui/login", strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.AddCookie(&http.Cookie{Name: "arap_login_csrf", Value: "tok"})
		resp, err = ui.Do(req)
		require.NoError(t, err)
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", body)
		require.Equal(t, "2", resp.Header.Get("Retry-After"))
		require.Contains(t, string(body), "unavailable")

		ready, err := http.Get(env.URL + "/readyz")
		require.NoError(t, err)
		body, _ = io.ReadAll(ready.Body)
		ready.Body.Close()
		require.Equal(t, http.StatusServiceUnavailable, ready.StatusCode)
		require.JSONEq(t, `{"status":"unavailable","reason":"the database is unavailable"}`, string(body), "no driver text in an unauthenticated probe")

		db.Start(t)
		// The pool reconnects on its own; wait for it, then all is normal.
		require.Eventually(t, func() bool {
			return pep.do("GET", status, nil).status == 200
		}, 30*time.Second, 50*time.Millisecond)
		require.Equal(t, 200, itsm.do("GET", "/v1/requests", nil).status)
		require.Equal(t, http.StatusSeeOther, uiGet().StatusCode)
	}
}
