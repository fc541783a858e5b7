package telemetry

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/trace/noop"
)

// BenchmarkHandler is the cost the tracing wrapper adds to one request
// when nothing is exported (the no-op provider FromEnv installs by
// default), against the bare handler.
func BenchmarkHandler(b *testing.B) {
	bare := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { Route(r.Context(), r.Method, "/x") })
	for _, c := range []struct {
		name string
		h    http.Handler
	}{
		{"bare", bare},
		{"noop", Handler(bare, noop.NewTracerProvider())},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			req := httptest.NewRequest(http.MethodPost, "/mcp", nil)
			req.Header.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
			for b.Loop() {
				c.h.ServeHTTP(httptest.NewRecorder(), req)
			}
		})
	}
}
