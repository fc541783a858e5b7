package pep_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLegacyCallerGetsUpstreamLogs: a 2025-11-25 caller's request carries
// no log level (the session's, set by logging/setLevel, is the one a
// stateless server cannot keep), so an allowed call it makes is answered on
// an event stream carrying the upstream's log messages at info and above,
// as a stateless 2025-11-25 server sends them; not as a single JSON
// response, which has no room for them.
func TestLegacyCallerGetsUpstreamLogs(t *testing.T) {
	t.Parallel()
	ext := startChatty(t, "ext")
	p, _ := relayPEP(t, ext, relayPolicy, nil)
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ext_work","arguments":{"q":"a"}}}`
	req, err := http.NewRequest(http.MethodPost, p.url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header = req0Header(aliceToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
	require.Contains(t, resp.Header.Get("Content-Type"), "text/event-stream", "%s", raw)
	n := notifications(t, raw)
	require.Len(t, n["notifications/message"], 1, "info, not debug: %s", raw)
	require.Equal(t, "work step one", n["notifications/message"][0]["data"])
	require.Contains(t, string(raw), "ext worked")
}
