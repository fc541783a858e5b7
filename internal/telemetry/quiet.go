package telemetry

import (
	"context"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"
)

// Periodic maintenance jobs (the expiry and reminder sweeps) run every
// second and mostly find nothing to do: a trace for each would bury the
// traces of real work (60 of 91 spans of a quiet minute). QuietJobs keeps
// River's spans of such jobs, and of the leader's inserts of them, out of
// the traces; a sweep that finds work says so with a span of its own
// (Working).

// QuietJobs wraps tp so that River's work spans of the job kinds given, and
// its insert spans that start no trace's part (the periodic enqueuer's),
// are not recorded.
func QuietJobs(tp trace.TracerProvider, kinds ...string) trace.TracerProvider {
	return quietProvider{tp: tp, kinds: kinds}
}

type quietProvider struct {
	embedded.TracerProvider
	tp    trace.TracerProvider
	kinds []string
}

func (p quietProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return quietTracer{t: p.tp.Tracer(name, opts...), p: p}
}

type quietTracer struct {
	embedded.Tracer
	t trace.Tracer
	p quietProvider
}

type realTracerKey struct{}

var silent = noop.NewTracerProvider().Tracer("")

func (q quietTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	kind, work := strings.CutPrefix(name, "river.work/")
	quiet := (work && slices.Contains(q.p.kinds, kind)) ||
		(name == "river.insert_many" && !trace.SpanContextFromContext(ctx).IsValid())
	if !quiet {
		return q.t.Start(ctx, name, opts...)
	}
	ctx = context.WithValue(ctx, realTracerKey{}, q.t)
	return silent.Start(ctx, name, opts...)
}

// Working starts a span for work a quiet job found (a sweep that expired
// requests), with the tracer its River span would have had; elsewhere, a
// child of the span in ctx.
func Working(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	t, ok := ctx.Value(realTracerKey{}).(trace.Tracer)
	if !ok {
		t = trace.SpanFromContext(ctx).TracerProvider().Tracer("github.com/omcp/arap")
	}
	return t.Start(ctx, name, trace.WithAttributes(attrs...))
}
