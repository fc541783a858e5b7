package pep_test

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/pep"
	"github.com/omcp/arap/webhook"
)

// TestBadBytesAtTheFrontEnd: NUL, control bytes and invalid UTF-8 in the
// front-end's paths and queries are 404/400, in tool arguments a JSON-RPC
// invalid-params error before any evaluation, and in a (validly signed)
// callback a 400; never a 500 from PostgreSQL.
func TestBadBytesAtTheFrontEnd(t *testing.T) {
	t.Parallel()
	secret := webhook.NewSecret()
	url := serverWith(t, pep.ServerOptions{Name: "test", Version: "0", WebhookSecrets: []string{secret}})
	base := strings.TrimSuffix(url, pep.PathMCP)

	for _, c := range []struct {
		method, path string
		want         int
	}{
		{"POST", "/mcp%00", 404}, {"POST", "/mcp/%ff", 404}, {"GET", "/healthz%00", 404},
		{"POST", "/mcp?x=%00", 400}, {"POST", "/mcp?%ff=1", 400}, {"GET", "/healthz?a=%C0%AF", 400}, {"POST", "/callbacks/arap?s=%01", 400},
	} {
		req, err := http.NewRequest(c.method, base+c.path, strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer alice-token-0123")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, c.want, resp.StatusCode, "%s %s: %s", c.method, c.path, body)
		require.NotEmpty(t, body)
	}

	// Tool arguments with a NUL are refused as invalid params; the gate does
	// not ask the PDP (unreachable here: asking would say "unavailable").
	for _, args := range []string{`{"to":"acct\u0000","amount":10}`, `{"to":"acct","amount":10,"\u0000":1}`} {
		status, body := send(t, url, "Bearer alice-token-0123", "tools/call", `{"name":"wire_transfer","arguments":`+args+`}`)
		require.Less(t, status, 500, body)
		require.Contains(t, body, `"code":-32602`, body)
		require.Contains(t, body, "without NUL characters", body)
	}

	// Arguments the tool's schema refuses: the refusal names the field as it
	// is spelled and says what to send, and quotes no argument value.
	status, body := send(t, url, "Bearer alice-token-0123", "tools/call", `{"name":"wire_transfer","arguments":{"to":991,"amount":-5,"memo":"x"}}`)
	require.Less(t, status, 500, body)
	require.Contains(t, body, `"code":-32602`, body)
	require.Contains(t, body, "invalid arguments for wire_transfer: amount: must be at least 0.01; use a larger number. "+
		"memo: is not a field here; remove it. to: must be a string, not a number; send it as a string", body)
	require.NotContains(t, body, "jsonschema", "not the validator's own text")

	// A signed callback whose state or task id is not text: 400, nothing
	// looked up. A well-formed one about no pending task: 204.
	key, err := webhook.ParseSecret(secret)
	require.NoError(t, err)
	for i, c := range []struct {
		body string
		want int
	}{
		{`{"state":"tsk_\u0000","task":{"id":"arq_A"}}`, 400},
		{`{"state":"tsk_A","task":{"id":"arq_\u0000"}}`, 400},
		{`{"state":"","task":{"id":"arq_A"}}`, 400},
		{`{"state":"tsk_A","task":{"id":"arq_A"}}`, 204},
	} {
		id := "msg_" + string(rune('a'+i))
		now := time.Now().Unix()
		req, err := http.NewRequest("POST", base+pep.PathCallback, bytes.NewReader([]byte(c.body)))
		require.NoError(t, err)
		req.Header.Set(webhook.HeaderID, id)
		req.Header.Set(webhook.HeaderTimestamp, strconv.FormatInt(now, 10))
		req.Header.Set(webhook.HeaderSignature, webhook.Sign(key, id, now, []byte(c.body)))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, c.want, resp.StatusCode, "%s: %s", c.body, body)
	}
}
