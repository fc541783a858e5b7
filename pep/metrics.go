package pep

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/version"
	"github.com/omcp/arap/mcp/tasks"
)

// Outcomes of a tools/call as the caller got it (arap_pep_calls_total), and
// of a task as it ended (arap_pep_tasks_ended_total: the dispositions, or
// failed, cancelled). Every label value is from these lists, the configured
// tool names, or the configured upstream names: never arguments, callers
// or error text.
const (
	OutcomeAllowedExecuted   = "allowed-executed"    // allowed at once; the tool ran
	OutcomeExecutionError    = "execution-error"     // allowed at once; the tool ran and failed
	OutcomeDenied            = "denied-not-executed" // denied (policy, limits, declined input)
	OutcomeDegraded          = "degraded"            // requestable, but the client cannot wait for a task
	OutcomeApprovalPending   = "approval-pending"    // approval tools: a request made or waited on for a client without tasks
	OutcomeTaskCreated       = "task-created"        // an approval task (new, or the live one for the same call)
	OutcomeInputRequired     = "input-required"      // an MRTR round before the request is made
	OutcomeMissingCapability = "missing-capability"  // -32021: a task-required tool without the tasks extension
	OutcomeInvalid           = "invalid"             // -32602: bad arguments or a bad requestState
	OutcomeError             = "error"               // any other JSON-RPC error (the backend unreachable...)

	EndedFailed    = "failed"
	EndedCancelled = "cancelled"
)

// Upstream error kinds (arap_pep_upstream_errors_total).
const (
	UpstreamTimeout    = "timeout"    // a deadline passed
	UpstreamCanceled   = "canceled"   // the caller went away
	UpstreamRPC        = "rpc"        // the upstream answered with a JSON-RPC error
	UpstreamConnection = "connection" // it could not be reached, or the connection broke
	UpstreamOther      = "other"
)

// Metrics are the front-end's Prometheus metrics, on a registry of their
// own: `arapd dev` runs the backend, whose metrics are on the default
// registry, in the same process, and each /metrics shows its own process
// part. The zero value is not usable; a nil *Metrics records nothing.
type Metrics struct {
	reg      *prometheus.Registry
	calls    *prometheus.CounterVec
	ended    *prometheus.CounterVec
	upDur    *prometheus.HistogramVec
	upErrors *prometheus.CounterVec
	http     *prometheus.CounterVec
	cache    *prometheus.CounterVec
	forgets  *prometheus.CounterVec
}

// NewMetrics makes the front-end's metrics on a fresh registry, with the Go
// runtime's and the process's collectors.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "arap_pep_calls_total", Help: "tools/call requests decided by the gate, by tool and by what the caller got (outcome).",
		}, []string{"tool", "outcome"}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "arap_pep_tasks_ended_total", Help: "Approval tasks ended by this process, by disposition (or failed, cancelled).",
		}, []string{"outcome"}),
		upDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "arap_pep_upstream_request_duration_seconds", Help: "Requests to upstream MCP servers, by upstream, failed ones included.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"upstream"}),
		upErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "arap_pep_upstream_errors_total", Help: "Failed requests to upstream MCP servers, by upstream and kind (timeout, canceled, rpc, connection, other).",
		}, []string{"upstream", "kind"}),
		http: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "arap_pep_http_requests_total", Help: "HTTP requests served by the MCP front-end, by route and status code.",
		}, []string{"method", "route", "code"}),
		cache: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "arap_pep_decision_cache_total", Help: "Decisions the gate needed, by result: hit (an allowed decision reused), miss (asked the PDP), bypass (asked the PDP; the cache is off: no change stream, or disabled).",
		}, []string{"result"}),
		forgets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "arap_pep_decision_cache_invalidations_total", Help: "Times the decision cache was emptied, by cause: policy, attributes, directory, client (announced by the backend), caller (a caller revoked), stream-lost (the change stream ended), other.",
		}, []string{"cause"}),
	}
	m.reg.MustRegister(m.calls, m.ended, m.upDur, m.upErrors, m.http, m.cache, m.forgets, version.Collector(),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Register adds a collector to the front-end's registry.
func (m *Metrics) Register(c prometheus.Collector) error { return m.reg.Register(c) }

// Handler serves the registry in the Prometheus text format. A collector
// that fails (the task counts, with the database down) is left out of that
// scrape, and logged; the rest is served.
func (m *Metrics) Handler(log *slog.Logger) http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError, ErrorLog: scrapeLog{log}})
}

// scrapeLog logs the errors of a scrape.
type scrapeLog struct{ log *slog.Logger }

func (l scrapeLog) Println(v ...any) { l.log.Warn("metrics: " + fmt.Sprint(v...)) }

// ObserveUpstream records one request to an upstream MCP server (name as
// configured): how long it took and, if err is not nil, what kind of
// failure it was. The upstream client calls it once per request.
func (m *Metrics) ObserveUpstream(upstream string, took time.Duration, err error) {
	if m == nil {
		return
	}
	m.upDur.WithLabelValues(upstream).Observe(took.Seconds())
	if err != nil {
		m.upErrors.WithLabelValues(upstream, upstreamErrorKind(err)).Inc()
	}
}

// upstreamErrorKind sorts a failed upstream request into a bounded kind.
func upstreamErrorKind(err error) string {
	var rpc *jsonrpc.Error
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return UpstreamTimeout
	case errors.Is(err, context.Canceled):
		return UpstreamCanceled
	case errors.As(err, &rpc):
		return UpstreamRPC
	case errors.Is(err, sdk.ErrConnectionClosed), errors.As(err, &ne):
		return UpstreamConnection
	}
	return UpstreamOther
}

// called counts one tools/call the gate answered.
func (m *Metrics) called(tool string, res sdk.Result, err error) string {
	outcome := callOutcome(res, err)
	if m != nil {
		m.calls.WithLabelValues(tool, outcome).Inc()
	}
	return outcome
}

// decisionLookup counts one decision the gate needed (CacheHit, CacheMiss,
// CacheBypass).
func (m *Metrics) decisionLookup(result string) {
	if m != nil {
		m.cache.WithLabelValues(result).Inc()
	}
}

// decisionsForgotten counts the decision cache emptied for cause (bounded
// to the known causes: the backend names the kinds).
func (m *Metrics) decisionsForgotten(cause string) {
	switch cause {
	case authzen.ChangePolicy, authzen.ChangeAttributes, authzen.ChangeDirectory, authzen.ChangeClient, causeCaller, causeStreamLost:
	default:
		cause = "other"
	}
	if m != nil {
		m.forgets.WithLabelValues(cause).Inc()
	}
}

// taskEnded counts a task that this process ended.
func (m *Metrics) taskEnded(outcome string) {
	if m != nil {
		m.ended.WithLabelValues(outcome).Inc()
	}
}

// served counts one HTTP request.
func (m *Metrics) served(method, route string, code int) {
	if m != nil {
		m.http.WithLabelValues(method, route, strconv.Itoa(code)).Inc()
	}
}

// callOutcome reads what the gate answered a tools/call (Gate.Call).
func callOutcome(res sdk.Result, err error) string {
	if err != nil {
		var rpc *jsonrpc.Error
		switch {
		case errors.As(err, &rpc) && rpc.Code == tasks.CodeMissingRequiredCapabilities:
			return OutcomeMissingCapability
		case errors.As(err, &rpc) && rpc.Code == tasks.CodeInvalidParams:
			return OutcomeInvalid
		}
		return OutcomeError
	}
	switch r := res.(type) {
	case *tasks.CreateResult, *tasks.LegacyCreateResult:
		return OutcomeTaskCreated
	case *sdk.CallToolResult:
		if r.InputRequests != nil { // an upstream's round may ask nothing, only for a retry
			return OutcomeInputRequired
		}
		if _, ok := r.Meta[MetaApproval]; ok {
			return OutcomeApprovalPending
		}
		if env, ok := r.Meta[MetaAuthorization].(Envelope); ok {
			if env.Remediation == RemediationUndisclosed {
				return OutcomeDegraded
			}
			return OutcomeDenied
		}
		if r.IsError {
			return OutcomeExecutionError
		}
		return OutcomeAllowedExecuted
	}
	return OutcomeError
}

// taskCounts is the arap_pep_tasks gauge, counted at each
// scrape (by the task store, which owns the table).
type taskCounts struct {
	store *tasks.Store
	desc  *prometheus.Desc
}

func newTaskCounts(s *tasks.Store) taskCounts {
	return taskCounts{store: s, desc: prometheus.NewDesc("arap_pep_tasks",
		"MCP tasks stored now (all replicas; ended ones until purged), by status.", []string{"status"}, nil)}
}

func (c taskCounts) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c taskCounts) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	counts, err := c.store.CountByStatus(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	for _, s := range tasks.AllStatuses {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[s]), string(s))
	}
}
