package arapclient_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/authzen"
)

// TestClientKeepsConnectionsForReuse: a PEP evaluates from many goroutines
// at once; the default client reuses its connections rather than dialling
// one per call past net/http's default of two idle per host.
func TestClientKeepsConnectionsForReuse(t *testing.T) {
	var dialled atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"decision":true}`))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dialled.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	c := &arapclient.Client{BaseURL: srv.URL, Token: "token"}
	// Rounds of concurrent calls, as tool calls come: between rounds every
	// connection is idle at once.
	const workers, rounds = 8, 20
	for range rounds {
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				d, err := c.Evaluate(context.Background(), authzen.EvaluationRequest{})
				if !(err == nil && d.Decision) {
					t.Errorf("evaluate: %v %+v", err, d)
				}
			})
		}
		wg.Wait()
	}
	// At most one per goroutine, give or take a dial that lost the race
	// to a connection freed meanwhile (net/http pools it all the same).
	require.LessOrEqual(t, dialled.Load(), int64(2*workers), "connections dialled for %d rounds of %d calls", rounds, workers)
}

// TestNotTheBackendSaysSo: a URL that answers without a problem document
// (the MCP endpoint, a proxy's page) is named in the error, with where the
// backend is, rather than a bare "404 about:blank".
func TestNotTheBackendSaysSo(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "404 page not found", http.StatusNotFound)
	}))
	t.Cleanup(srv.Close)
	c := &arapclient.Client{BaseURL: srv.URL, Token: "token"}
	_, err := c.Audit(context.Background(), arapclient.AuditOptions{})
	require.Error(t, err)
	require.Contains(t, err.Error(), srv.URL+"/v1/audit answered 404 without a problem document")
	require.Contains(t, err.Error(), "is that arap's backend")
}
