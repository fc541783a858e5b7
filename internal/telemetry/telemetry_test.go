package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// TestFromEnv: nothing is exported (a no-op provider) unless the OTEL_*
// variables say where; none and OTEL_SDK_DISABLED turn it off whatever
// else is set; what is not supported is refused, naming the variable.
func TestFromEnv(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		env  map[string]string
		sdk  bool
		err  string
	}{
		{name: "unset", env: nil},
		{name: "endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, sdk: true},
		{name: "traces endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, sdk: true},
		{name: "otlp exporter", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, sdk: true},
		{name: "none", env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}},
		{name: "disabled", env: map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}},
		{name: "bad disabled", env: map[string]string{"OTEL_SDK_DISABLED": "maybe"}, err: `OTEL_SDK_DISABLED="maybe"`},
		{name: "zipkin", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, err: `OTEL_TRACES_EXPORTER="zipkin": only otlp and none`},
		{name: "grpc", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, err: `OTEL_EXPORTER_OTLP_PROTOCOL="grpc"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			tp, shutdown, err := fromEnv(ctx, "test", func(k string) string { return c.env[k] })
			if c.err != "" {
				require.ErrorContains(t, err, c.err)
				return
			}
			require.NoError(t, err)
			defer func() { require.NoError(t, shutdown(ctx)) }()
			_, isSDK := tp.(*sdktrace.TracerProvider)
			_, isNoop := tp.(noop.TracerProvider)
			require.Equal(t, c.sdk, isSDK)
			require.Equal(t, !c.sdk, isNoop)
		})
	}
}

// TestLogHandler: a record logged with a context carrying a span has its
// trace and span ids; one without has neither; attributes and groups set
// on the logger are kept.
func TestLogHandler(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(LogHandler(slog.NewJSONHandler(&buf, nil))).With("process", "test")
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("t").Start(context.Background(), "work")
	defer span.End()
	read := func() map[string]any {
		var m map[string]any
		require.NoError(t, json.Unmarshal(buf.Bytes(), &m))
		buf.Reset()
		return m
	}
	log.InfoContext(ctx, "traced")
	m := read()
	require.Equal(t, span.SpanContext().TraceID().String(), m["trace_id"])
	require.Equal(t, span.SpanContext().SpanID().String(), m["span_id"])
	require.Equal(t, "test", m["process"])
	log.InfoContext(context.Background(), "untraced")
	m = read()
	require.NotContains(t, m, "trace_id")
	require.NotContains(t, m, "span_id")
}

// TestRouteNamesTheSpan: the server span is named by method and route, not
// by the path (which holds ids); the traceparent of a client request made
// under a span continues its trace on the server.
func TestRouteNamesTheSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	srv := httptest.NewServer(Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		Route(r.Context(), r.Method, "/things/{id}")
	}), tp))
	defer srv.Close()
	ctx, parent := tp.Tracer("t").Start(context.Background(), "caller")
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/things/42", nil)
	resp, err := (&http.Client{Transport: Transport(nil, tp)}).Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	parent.End()
	var server sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindServer {
			server = s
		}
		require.Equal(t, parent.SpanContext().TraceID(), s.SpanContext().TraceID(), "one trace: %s", s.Name())
	}
	require.NotNil(t, server)
	require.Equal(t, "GET /things/{id}", server.Name())
}

// TestTraceParentLink: a stored traceparent links back to its span; ""
// and a malformed one link to nothing.
func TestTraceParentLink(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("t").Start(context.Background(), "call")
	defer span.End()
	tparent := TraceParent(ctx)
	require.Regexp(t, `^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`, tparent)
	l, ok := Link(tparent)
	require.True(t, ok)
	require.Equal(t, span.SpanContext().TraceID(), l.SpanContext.TraceID())
	require.Equal(t, span.SpanContext().SpanID(), l.SpanContext.SpanID())
	require.Empty(t, TraceParent(context.Background()))
	for _, bad := range []string{"", "00-zz-1-01", "nonsense"} {
		_, ok := Link(bad)
		require.False(t, ok, bad)
	}
}

// TestJobOutcome: a job's outcome as counted: completed, retried (failed
// with attempts left), failed (none left), cancelled, snoozed.
func TestJobOutcome(t *testing.T) {
	job := func(attempt, max int) *rivertype.JobRow {
		return &rivertype.JobRow{Kind: "k", Attempt: attempt, MaxAttempts: max}
	}
	boom := errors.New("boom")
	require.Equal(t, "completed", outcome(job(1, 3), nil))
	require.Equal(t, "retried", outcome(job(1, 3), boom))
	require.Equal(t, "failed", outcome(job(3, 3), boom))
	require.Equal(t, "cancelled", outcome(job(1, 3), river.JobCancel(boom)))
	require.Equal(t, "snoozed", outcome(job(1, 3), river.JobSnooze(time.Second)))

	m := NewJobMetrics()
	require.ErrorIs(t, m.Work(context.Background(), job(3, 3), func(context.Context) error { return boom }), boom)
	require.NoError(t, m.Work(context.Background(), job(1, 3), func(context.Context) error { return nil }))
	require.Equal(t, 1.0, testutil.ToFloat64(m.jobs.WithLabelValues("k", "failed")))
	require.Equal(t, 1.0, testutil.ToFloat64(m.jobs.WithLabelValues("k", "completed")))
}

// TestNoopPassesTraceContextOn: with nothing recorded (the default), a
// caller's traceparent still reaches the handler's context (so its log
// records carry the trace id) and the calls it makes.
func TestNoopPassesTraceContextOn(t *testing.T) {
	const incoming = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	var forwarded string
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { forwarded = r.Header.Get("traceparent") }))
	defer down.Close()
	tp := noop.NewTracerProvider()
	client := &http.Client{Transport: Transport(nil, tp)}
	var logged bytes.Buffer
	log := slog.New(LogHandler(slog.NewJSONHandler(&logged, nil)))
	srv := httptest.NewServer(Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.InfoContext(r.Context(), "served")
		req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, down.URL, nil)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
	}), tp))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	req.Header.Set("traceparent", incoming)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, incoming, forwarded)
	var m map[string]any
	require.NoError(t, json.Unmarshal(logged.Bytes(), &m))
	require.Equal(t, "0af7651916cd43dd8448eb211c80319c", m["trace_id"])
}

// TestServiceName: the process is named as given, unless
// OTEL_SERVICE_NAME says otherwise.
func TestServiceName(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct{ env, want string }{{"", "arapd-test"}, {"billing-gate", "billing-gate"}} {
		t.Setenv("OTEL_SERVICE_NAME", c.env)
		tp, shutdown, err := fromEnv(ctx, "arapd-test", func(k string) string {
			return map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}[k]
		})
		require.NoError(t, err)
		got, ok := tp.(*sdktrace.TracerProvider)
		require.True(t, ok)
		rec := tracetest.NewSpanRecorder()
		got.RegisterSpanProcessor(rec)
		_, span := got.Tracer("t").Start(ctx, "x")
		span.End()
		name, _ := rec.Ended()[0].Resource().Set().Value("service.name")
		require.Equal(t, c.want, name.AsString())
		require.NoError(t, shutdown(ctx))
	}
}
