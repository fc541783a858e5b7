package telemetry

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// PoolCollector reports a pgx pool's statistics, labelled pool=name, read
// at each scrape.
func PoolCollector(name string, pool *pgxpool.Pool) prometheus.Collector {
	l := prometheus.Labels{"pool": name}
	d := func(metric, help string) *prometheus.Desc {
		return prometheus.NewDesc("arap_db_pool_"+metric, help, nil, l)
	}
	return &poolCollector{pool: pool, descs: [...]*prometheus.Desc{
		d("acquired_conns", "Connections in use."),
		d("idle_conns", "Idle connections."),
		d("total_conns", "Open connections (in use, idle and being opened)."),
		d("max_conns", "The pool's size limit."),
		d("acquires_total", "Connections acquired from the pool."),
		d("acquire_seconds_total", "Time spent acquiring connections."),
		d("empty_acquires_total", "Acquires that had to wait for a connection (none idle)."),
		d("canceled_acquires_total", "Acquires cancelled by their context while waiting."),
	}}
}

type poolCollector struct {
	pool  *pgxpool.Pool
	descs [8]*prometheus.Desc
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.pool.Stat()
	g, n := prometheus.GaugeValue, prometheus.CounterValue
	for i, v := range []struct {
		t prometheus.ValueType
		v float64
	}{
		{g, float64(s.AcquiredConns())}, {g, float64(s.IdleConns())}, {g, float64(s.TotalConns())}, {g, float64(s.MaxConns())},
		{n, float64(s.AcquireCount())}, {n, s.AcquireDuration().Seconds()}, {n, float64(s.EmptyAcquireCount())}, {n, float64(s.CanceledAcquireCount())},
	} {
		ch <- prometheus.MustNewConstMetric(c.descs[i], v.t, v.v)
	}
}

// JobMetrics is River worker middleware counting the jobs this process
// works, by kind and outcome (completed, retried: failed with attempts
// left, failed: failed with none, cancelled, snoozed), and timing them.
// It is a prometheus.Collector: register it where the process's metrics
// are served.
type JobMetrics struct {
	river.MiddlewareDefaults
	jobs     *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// NewJobMetrics makes the counters.
func NewJobMetrics() *JobMetrics {
	return &JobMetrics{
		jobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "arap_river_jobs_total", Help: "Background jobs worked by this process, by kind and outcome.",
		}, []string{"kind", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "arap_river_job_duration_seconds", Help: "Time working a background job, by kind.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"kind"}),
	}
}

// Work implements rivertype.WorkerMiddleware.
func (m *JobMetrics) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	start := time.Now()
	err := doInner(ctx)
	m.duration.WithLabelValues(job.Kind).Observe(time.Since(start).Seconds())
	m.jobs.WithLabelValues(job.Kind, outcome(job, err)).Inc()
	return err
}

func outcome(job *rivertype.JobRow, err error) string {
	var cancel *river.JobCancelError
	var snooze *river.JobSnoozeError
	switch {
	case err == nil:
		return "completed"
	case errors.As(err, &cancel):
		return "cancelled"
	case errors.As(err, &snooze):
		return "snoozed"
	case job.Attempt >= job.MaxAttempts:
		return "failed"
	default:
		return "retried"
	}
}

func (m *JobMetrics) Describe(ch chan<- *prometheus.Desc) {
	m.jobs.Describe(ch)
	m.duration.Describe(ch)
}

func (m *JobMetrics) Collect(ch chan<- prometheus.Metric) {
	m.jobs.Collect(ch)
	m.duration.Collect(ch)
}

// LeaderGauge is a gauge of a database-wide count that only the replica
// holding River's leadership reports (the others report nothing), so that
// summing it over replicas counts it once. A replica that cannot tell, or
// cannot count, reports nothing either: a scrape then lacks the series
// rather than doubling it.
func LeaderGauge(opts prometheus.GaugeOpts, leader func(context.Context) bool, count func(context.Context) (int, error)) prometheus.Collector {
	return &leaderGauge{desc: prometheus.NewDesc(prometheus.BuildFQName(opts.Namespace, opts.Subsystem, opts.Name), opts.Help, nil, opts.ConstLabels), leader: leader, count: count}
}

type leaderGauge struct {
	desc   *prometheus.Desc
	leader func(context.Context) bool
	count  func(context.Context) (int, error)
}

func (g *leaderGauge) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

func (g *leaderGauge) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if !g.leader(ctx) {
		return
	}
	n, err := g.count(ctx)
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, float64(n))
}
