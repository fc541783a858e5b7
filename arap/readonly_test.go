package arap_test

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/internal/pgembed"
)

// readyzOf returns the backend's /readyz status and body.
func readyzOf(t *testing.T, base string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get(base + "/readyz")
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var body map[string]any
	require.NoError(t, json.Unmarshal(raw, &body), "%s", raw)
	return resp.StatusCode, body
}

// TestReadOnlyDatabase (issue 36 item 2): the backend's database address
// comes to lead to a streaming standby (a stale DNS name, a pooler
// pointing at a former primary: here a switch in front of both). A write
// is refused 503 with Retry-After (problem+json, never a 500), /readyz is
// 503 saying read-only; once the address leads to the primary again, all
// is served, and /readyz shows the durability with its warning (an
// asynchronous standby only) while ready. Through the contract proxy.
func TestReadOnlyDatabase(t *testing.T) {
	t.Parallel()
	db := dbtest.NewReplicated(t)
	sw := dbtest.NewSwitch(t, dbtest.Addr(db.Primary))
	env := backendtest.Start(t, backendtest.Options{DatabaseURL: sw.URL(db.URL)})
	itsm := api{t: t, base: env.URL, token: dev.ITSMToken}
	id := env.Submit(t, wireCall(50000))
	standby, _ := db.Standby(t, pgembed.StandbyOptions{Name: "async_one"})
	db.WaitReplayed(t, standby)

	code, body := readyzOf(t, env.URL)
	require.Equal(t, http.StatusOK, code, "%v", body)
	database, _ := body["database"].(map[string]any)
	require.Equal(t, false, database["read_only"], "%v", body)
	require.Equal(t, "on", database["synchronous_commit"])
	require.Contains(t, database["warning"], "no synchronous standby is configured", "a warning, not an outage")

	sw.To(dbtest.Addr(standby))
	decide := func() reply {
		return itsm.do("POST", "/v1/requests/"+id+"/decisions", map[string]any{"decision": "approve", "reason": "CHG1"})
	}
	// The first may meet a connection the switch cut: a 503 as well.
	for range 3 {
		r := decide()
		m := r.problem(t, http.StatusServiceUnavailable, authzen.ProblemUnavailable)
		require.Equal(t, "the database is unavailable; retry after 2 seconds", m["detail"])
		require.Equal(t, "2", r.header.Get("Retry-After"))
	}

	code, body = readyzOf(t, env.URL)
	require.Equal(t, http.StatusServiceUnavailable, code, "%v", body)
	require.Equal(t, "unavailable", body["status"])
	require.Equal(t, "the database is read-only (a standby in recovery, or transaction_read_only is on): writes are refused", body["reason"])
	database, _ = body["database"].(map[string]any)
	require.Equal(t, true, database["read_only"], "%v", body)
	require.Equal(t, true, database["in_recovery"], "%v", body)

	// The address leads to the primary again: served, nothing lost.
	sw.To(dbtest.Addr(db.Primary))
	require.Eventually(t, func() bool { c, _ := readyzOf(t, env.URL); return c == http.StatusOK }, 30*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool { return decide().status == http.StatusOK }, 30*time.Second, 50*time.Millisecond)
	require.Equal(t, 200, api{t: t, base: env.URL, token: dev.PEPToken}.do("GET", "/access/v1/requests/"+id, nil).status)
}
