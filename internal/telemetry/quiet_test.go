package telemetry_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/omcp/arap/internal/telemetry"
)

// TestQuietJobs (issue 38): a quiet periodic job's runs, and the
// periodic enqueuer's inserts (no trace around them), are not recorded;
// other jobs' are, and so is an insert inside a trace; a quiet run that
// finds work records it with Working.
func TestQuietJobs(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := telemetry.QuietJobs(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)), "requests.expire_due")
	tr := tp.Tracer("otelriver")
	ctx := context.Background()

	_, s := tr.Start(ctx, "river.work/requests.expire_due")
	s.End()
	_, s = tr.Start(ctx, "river.insert_many")
	s.End()
	require.Empty(t, rec.Ended(), "an idle sweep leaves no trace")

	wctx, s := tr.Start(ctx, "river.work/requests.expire_due")
	_, w := telemetry.Working(wctx, "requests.expire_due")
	w.End()
	s.End()
	reqCtx, parent := tr.Start(ctx, "POST /access/v1/requests")
	_, ins := tr.Start(reqCtx, "river.insert_many")
	ins.End()
	parent.End()
	_, s = tr.Start(ctx, "river.work/callbacks.deliver")
	s.End()
	var names []string
	for _, sp := range rec.Ended() {
		names = append(names, sp.Name())
	}
	require.Equal(t, []string{"requests.expire_due", "river.insert_many", "POST /access/v1/requests", "river.work/callbacks.deliver"}, names)
}
