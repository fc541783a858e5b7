// Package telemetry holds what both arapd processes need for tracing and
// metrics beyond the libraries: the tracer provider built from the standard
// OTEL_* variables, W3C trace context propagation, a slog handler that adds
// trace and span ids to log records, a Prometheus collector over a pgx pool,
// River job metrics, and a gauge reported by one replica only.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Propagator is the one trace context format spoken on every hop (HTTP
// headers, River job metadata, the context stored with a task): W3C
// traceparent/tracestate. It is passed explicitly rather than read from
// the global, so nothing depends on the order main sets globals in.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// Provider returns tp, or the global provider when tp is nil (a process
// configured by FromEnv sets the global; tests pass their own).
func Provider(tp trace.TracerProvider) trace.TracerProvider {
	if tp == nil {
		return otel.GetTracerProvider()
	}
	return tp
}

// FromEnv builds the process's tracer provider from the standard
// OpenTelemetry variables and installs it as the global provider. Nothing
// is exported (a no-op provider: no spans are recorded, near-zero cost)
// unless OTEL_TRACES_EXPORTER or an OTLP endpoint variable says where to;
// OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turn it off
// whatever else is set. The exporter is OTLP over HTTP/protobuf
// (otlptracehttp reads OTEL_EXPORTER_OTLP_* itself: endpoint, headers,
// timeout, TLS); OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES name the
// process, OTEL_TRACES_SAMPLER(_ARG) sample it. The returned function
// flushes and stops the exporter.
func FromEnv(ctx context.Context, service string) (trace.TracerProvider, func(context.Context) error, error) {
	tp, shutdown, err := fromEnv(ctx, service, os.Getenv)
	if err != nil {
		return nil, nil, err
	}
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(Propagator)
	return tp, shutdown, nil
}

func fromEnv(ctx context.Context, service string, getenv func(string) string) (trace.TracerProvider, func(context.Context) error, error) {
	none := func(context.Context) error { return nil }
	if v := getenv("OTEL_SDK_DISABLED"); v != "" {
		if off, err := strconv.ParseBool(v); err != nil {
			return nil, nil, fmt.Errorf("OTEL_SDK_DISABLED=%q: want true or false", v)
		} else if off {
			return noop.NewTracerProvider(), none, nil
		}
	}
	exporter := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER"))
	switch exporter {
	case "none":
		return noop.NewTracerProvider(), none, nil
	case "":
		if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return noop.NewTracerProvider(), none, nil
		}
	case "otlp":
	default:
		return nil, nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: only otlp and none are supported", exporter)
	}
	protocol := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if protocol != "" && protocol != "http/protobuf" {
		return nil, nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q: only http/protobuf is supported", protocol)
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (WithFromEnv, later)
	// win over the name given here.
	res, err := resource.New(ctx, resource.WithTelemetrySDK(), resource.WithAttributes(attribute.String("service.name", service)), resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, nil, fmt.Errorf("OpenTelemetry resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return tp, tp.Shutdown, nil
}

// Handler wraps an HTTP server's handler: the request's trace context is
// taken from its traceparent header and a server span covers it. The span
// is named by the method until the router knows the route (Route renames
// it), so that names never hold ids.
func Handler(h http.Handler, tp trace.TracerProvider) http.Handler {
	if isNoop(tp) {
		// Nothing is recorded: only carry the caller's trace context on
		// (to our logs and our own calls), at a fraction of the cost.
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("traceparent") != "" {
				r = r.WithContext(Propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header)))
			}
			h.ServeHTTP(w, r)
		})
	}
	return otelhttp.NewHandler(h, "http", otelhttp.WithTracerProvider(Provider(tp)), otelhttp.WithPropagators(Propagator),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method }))
}

// Route names the request's server span by its route pattern
// ("POST /access/v1/requests/{id}/cancel"), once the router has matched it.
func Route(ctx context.Context, method, route string) {
	trace.SpanFromContext(ctx).SetName(method + " " + route)
}

// Transport wraps an HTTP client's transport (nil: http.DefaultTransport):
// each request gets a client span and carries its traceparent.
func Transport(rt http.RoundTripper, tp trace.TracerProvider) http.RoundTripper {
	if rt == nil {
		rt = http.DefaultTransport
	}
	if isNoop(tp) {
		return propagating{rt}
	}
	return otelhttp.NewTransport(rt, otelhttp.WithTracerProvider(Provider(tp)), otelhttp.WithPropagators(Propagator),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method }))
}

// isNoop reports whether tp records nothing: the provider FromEnv installs
// when no exporter is configured.
func isNoop(tp trace.TracerProvider) bool {
	_, ok := Provider(tp).(noop.TracerProvider)
	return ok
}

// propagating passes the trace context of a request's context on in its
// headers, for a process that records no spans of its own.
type propagating struct{ next http.RoundTripper }

func (p propagating) RoundTrip(r *http.Request) (*http.Response, error) {
	if trace.SpanContextFromContext(r.Context()).IsValid() {
		r = r.Clone(r.Context()) // a RoundTripper must not change the caller's request
		Propagator.Inject(r.Context(), propagation.HeaderCarrier(r.Header))
	}
	return p.next.RoundTrip(r)
}

// TraceParent is the W3C traceparent of ctx's span, "" when it has none.
func TraceParent(ctx context.Context) string {
	c := propagation.MapCarrier{}
	Propagator.Inject(ctx, c)
	return c["traceparent"]
}

// Link is a span link to the span a stored traceparent names; ok is false
// for "" or a malformed value (then there is nothing to link to).
func Link(traceparent string) (trace.Link, bool) {
	if traceparent == "" {
		return trace.Link{}, false
	}
	ctx := Propagator.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent})
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return trace.Link{}, false
	}
	return trace.Link{SpanContext: sc}, true
}
