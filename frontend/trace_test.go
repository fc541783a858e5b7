package frontend_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/frontend"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/internal/telemetry"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
)

// spans is what a span recorder holds, with the lookups the trace test
// needs.
type spans []sdktrace.ReadOnlySpan

func (ss spans) named(name string) spans {
	var out spans
	for _, s := range ss {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func (ss spans) in(id trace.TraceID) spans {
	var out spans
	for _, s := range ss {
		if s.SpanContext().TraceID() == id {
			out = append(out, s)
		}
	}
	return out
}

// client finds the client spans calling a URL ending in path.
func (ss spans) client(path string) spans {
	var out spans
	for _, s := range ss {
		if s.SpanKind() != trace.SpanKindClient {
			continue
		}
		for _, a := range s.Attributes() {
			if a.Key == "url.full" && strings.HasSuffix(a.Value.AsString(), path) {
				out = append(out, s)
			}
		}
	}
	return out
}

func (ss spans) names() []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.Name())
	}
	return out
}

func linksTo(s sdktrace.ReadOnlySpan, sc trace.SpanContext) bool {
	return slices.ContainsFunc(s.Links(), func(l sdktrace.Link) bool {
		return l.SpanContext.TraceID() == sc.TraceID() && l.SpanContext.SpanID() == sc.SpanID()
	})
}

func attr(s sdktrace.ReadOnlySpan, key attribute.Key) string {
	for _, a := range s.Attributes() {
		if a.Key == key {
			return a.Value.Emit()
		}
	}
	return ""
}

// TestOneTraceCoversAGatedCall: a gated tools/call is one trace from the
// MCP request through the PDP evaluation and the ARAP submission (client
// and server spans, carried by traceparent) to the tracking job it queues;
// its trace context is stored with the task, so the callback's handling,
// the re-evaluation and the execution after the human decision (each in a
// trace of its own: the callback's delivery job's) link to it; the
// callback POST belongs to the backend's delivery job span; and a log
// record written while serving the call carries its trace id.
func TestOneTraceCoversAGatedCall(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	logs, backendLogs := &lockedBuffer{}, &lockedBuffer{}
	jsonLog := func(w *lockedBuffer) *slog.Logger {
		return slog.New(telemetry.LogHandler(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})))
	}
	env := backendtest.Start(t, backendtest.Options{TracerProvider: tp, Log: jsonLog(backendLogs)})
	ctx := context.Background()
	f, err := frontend.New(ctx, frontend.Config{Addr: "127.0.0.1:0", DatabaseURL: dbtest.URL(t), MasterKey: make([]byte, 32), Tools: pep.DemoTools(),
		BackendURL: env.URL, BackendToken: dev.PEPToken, WebhookSecrets: []string{dev.PEPWebhookSecret}, TracerProvider: tp,
		// A poll far off: the callback, not a look, wakes the task.
		PollInterval: time.Hour,
		Log:          jsonLog(logs)})
	require.NoError(t, err)
	require.NoError(t, f.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = f.Stop(ctx)
	})
	s := &opsStack{env: env, f: f, log: logs}
	alice := s.caller(t, "alice-agent")

	r, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-1", "amount": 50000}, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeTask, r.ResultType, "%s", r.Raw)
	taskID := r.Task.TaskID

	// The human decision, through the decision API; the callback does the
	// rest.
	var backendID string
	require.NoError(t, f.Pool().QueryRow(ctx, `SELECT backend_id FROM pep.approval_tasks WHERE task_id = $1`, taskID).Scan(&backendID))
	req, err := http.NewRequest(http.MethodPost, env.URL+"/v1/requests/"+backendID+"/decisions", strings.NewReader(`{"decision": "approve", "reason": "test"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+dev.ITSMToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		d, _, err := alice.Get(ctx, taskID)
		require.NoError(c, err)
		require.Equal(c, tasks.Completed, d.Status)
	}, 30*time.Second, 20*time.Millisecond)

	// The call's trace: the tools/call span and everything under it.
	var call sdktrace.ReadOnlySpan
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		all := spans(rec.Ended())
		calls := all.named("tools/call")
		require.Len(c, calls, 1)
		call = calls[0]
		// The work after the decision has ended too (the delivery job's
		// span ends once the callback is answered, perhaps after the
		// execution).
		require.NotEmpty(c, all.named("pep.execute"))
		require.NotEmpty(c, all.named("river.work/callbacks.deliver"))
	}, 30*time.Second, 20*time.Millisecond)
	all := spans(rec.Ended())
	id := call.SpanContext().TraceID()
	trace1 := all.in(id)
	t.Logf("the call's trace: %v", trace1.names())

	mcp := trace1.named("POST " + pep.PathMCP)
	require.Len(t, mcp, 1, "the MCP request's server span")
	require.Equal(t, trace.SpanKindServer, mcp[0].SpanKind())
	require.Equal(t, mcp[0].SpanContext().SpanID(), call.Parent().SpanID(), "tools/call is under it")
	require.Equal(t, "wire_transfer", attr(call, "mcp.tool"))

	for _, path := range []string{authzen.PathEvaluation, authzen.PathRequests} {
		clients := trace1.client(path)
		require.NotEmpty(t, clients, "the front-end's client span for %s", path)
		servers := trace1.named("POST " + path)
		require.NotEmpty(t, servers, "the backend's server span for %s", path)
		require.Equal(t, trace.SpanKindServer, servers[0].SpanKind())
		require.True(t, slices.ContainsFunc(clients, func(c sdktrace.ReadOnlySpan) bool {
			return c.SpanContext().SpanID() == servers[0].Parent().SpanID()
		}), "the backend's span for %s is the child of the front-end's call (traceparent)", path)
	}

	// The callback: a POST from the backend's delivery job, handled by the
	// front-end in that job's trace; its advance links to the stored call.
	callbacks := all.named("POST " + pep.PathCallback)
	require.NotEmpty(t, callbacks, "the front-end's callback server span")
	cb := callbacks[0]
	require.NotEqual(t, id, cb.SpanContext().TraceID(), "the callback is a trace of its own (the decision's)")
	cbTrace := all.in(cb.SpanContext().TraceID())
	deliveries := cbTrace.named("river.work/callbacks.deliver")
	require.NotEmpty(t, deliveries, "the callback POST belongs to the delivery job's span: %v", cbTrace.names())
	// The delivery job links to the decision that queued it (River job
	// metadata carries the trace context).
	decisions := all.named("POST /v1/requests/{id}/decisions")
	require.Len(t, decisions, 1)
	// The backend stored the submission's trace context with the request:
	// the decision links to the backend's submission span.
	submitted := trace1.named("POST " + authzen.PathRequests)
	require.True(t, linksTo(decisions[0], submitted[0].SpanContext()), "the decision links to the submission's trace")
	queued := all.in(decisions[0].SpanContext().TraceID()).named("river.insert_many")
	require.True(t, slices.ContainsFunc(queued, func(i sdktrace.ReadOnlySpan) bool { return linksTo(deliveries[0], i.SpanContext()) }),
		"the delivery job's span links to its insert in the decision's trace")
	require.NotEmpty(t, cbTrace.client(pep.PathCallback), "the delivery job's client span")

	for _, name := range []string{"pep.advance", "pep.reevaluate", "pep.execute"} {
		linked := slices.ContainsFunc(all.named(name), func(s sdktrace.ReadOnlySpan) bool {
			return s.SpanContext().TraceID() == cb.SpanContext().TraceID() && linksTo(s, call.SpanContext())
		})
		require.True(t, linked, "%s, in the callback's trace, links to the stored tools/call context", name)
	}

	// A log record written while serving the call carries its trace id,
	// on both processes: the front-end's access log line of the call, the
	// backend's of the evaluation it asked for.
	logged := func(logs *lockedBuffer, match func(map[string]any) bool) func(*assert.CollectT) {
		return func(c *assert.CollectT) {
			found := false
			for line := range strings.SplitSeq(logs.String(), "\n") {
				var l map[string]any
				if json.Unmarshal([]byte(line), &l) == nil && l["msg"] == "http request" && match(l) {
					found = found || l["trace_id"] == id.String() && l["span_id"] != ""
				}
			}
			assert.True(c, found, "the call's access log line carries its trace id")
		}
	}
	require.EventuallyWithT(t, logged(logs, func(l map[string]any) bool { return l["tool"] == "wire_transfer" }), 10*time.Second, 20*time.Millisecond)
	require.EventuallyWithT(t, logged(backendLogs, func(l map[string]any) bool { return l["route"] == authzen.PathEvaluation }), 10*time.Second, 20*time.Millisecond)
}
