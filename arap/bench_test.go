package arap_test

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dev"
)

// BenchmarkEvaluateHTTP is one POST /access/v1/evaluation answered with a
// requestable denial, client and server on loopback, one at a time: the
// backend's whole cost of an evaluation (routing, authentication, decoding,
// the PDP, the binding_token, encoding) plus an HTTP client's.
func BenchmarkEvaluateHTTP(b *testing.B) {
	env := backendtest.Start(b, backendtest.Options{})
	url := "http://" + env.Backend.Addr() + "/access/v1/evaluation"
	body := []byte(`{"subject":{"type":"user","id":"alice","properties":{"act":{"sub":"agent:demo"}}},"action":{"name":"tools/call"},` +
		`"resource":{"type":"mcp_tool","id":"wire_transfer","properties":{"arguments":{"to":"acct-991","amount":50000}}}}`)
	client := &http.Client{}
	b.ReportAllocs()
	for b.Loop() {
		req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+dev.PEPToken)
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !bytes.Contains(out, []byte(`"binding_token"`)) {
			b.Fatalf("HTTP %d %s", resp.StatusCode, out)
		}
	}
}
