package e2e

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	collector "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpSink is an OTLP/HTTP trace receiver: the span names it was sent, by
// service.name.
type otlpSink struct {
	mu    sync.Mutex
	spans map[string][]string
}

func (o *otlpSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req collector.ExportTraceServiceRequest
	if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
		http.Error(w, "not OTLP traces", http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		service := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				service = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				o.spans[service] = append(o.spans[service], s.Name)
			}
		}
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
}

func (o *otlpSink) names(service string) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.spans[service])
}

// TestTracingAndMetricsListener: `arapd mcp` configured by the standard
// OTEL_* variables exports its spans (OTLP over HTTP) under its service
// name; with --metrics-addr (ARAP_METRICS_ADDR) /metrics is served there
// and not on the MCP listener.
func TestTracingAndMetricsListener(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{})
	sink := &otlpSink{spans: map[string][]string{}}
	collectorSrv := httptest.NewServer(sink)
	t.Cleanup(collectorSrv.Close)
	env := []string{
		"DATABASE_URL=" + s.dbURL, "ARAP_PEP_MASTER_KEY=" + pepMasterKey, "ARAP_BACKEND_TOKEN=" + s.pepToken,
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + collectorSrv.URL, "OTEL_BSP_SCHEDULE_DELAY=100",
		"ARAP_METRICS_ADDR=127.0.0.1:0",
	}
	mcp := startArapd(t, env, "mcp", "--addr", "127.0.0.1:0", "--backend-url", s.api, "--demo-tools")
	started := mcp.waitLog("mcp front-end started", 10*time.Second)
	metricsAddr, _ := started["metrics_addr"].(string)
	require.NotEmpty(t, metricsAddr, "the started line names the metrics listener")

	c := s.client(s.alice)
	c.URL = mcp.url() + "/mcp"
	res, err := c.CallTool(context.Background(), "get_balance", map[string]any{}, nil)
	require.NoError(t, err)
	require.False(t, res.IsError, "%s", res.Raw)

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		names := sink.names("arapd-mcp")
		assert.Contains(c, names, "tools/call")
		assert.Contains(c, names, "POST /mcp")
	}, 30*time.Second, 50*time.Millisecond)

	get := func(url string) int {
		resp, err := http.Get(url)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusNotFound, get(mcp.url()+"/metrics"))
	require.Equal(t, http.StatusOK, get("http://"+metricsAddr+"/metrics"))
	require.Equal(t, http.StatusOK, get(mcp.url()+"/healthz"))
}
