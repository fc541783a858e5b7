package callbacks_test

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dev"
)

func scrape(t require.TestingT, url string) (int, string) {
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// sample is the value of the sample with exactly this name and labels.
func sample(body, name string) (string, bool) {
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return v, true
		}
	}
	return "", false
}

// TestQueueGaugeCountedOnce: two replicas on one database; the callback
// queue gauge (a database-wide count) is reported by exactly one of them,
// the River leader, so that summing over replicas counts it once. So is
// the pending requests gauge.
func TestQueueGaugeCountedOnce(t *testing.T) {
	a := backendtest.Start(t, backendtest.Options{})
	b := backendtest.Start(t, backendtest.Options{Join: a})
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		reporting := 0
		for _, env := range []*backendtest.Env{a, b} {
			_, body := scrape(c, env.URL+"/metrics")
			_, queue := sample(body, "arap_callback_queue_depth")
			_, pending := sample(body, "arap_requests_pending")
			assert.Equal(c, queue, pending, "both gauges from the same replica")
			if queue {
				reporting++
			}
		}
		assert.Equal(c, 1, reporting, "exactly one replica reports the queue")
	}, 30*time.Second, 50*time.Millisecond)
}

// TestBackendMetrics: the backend's /metrics has its pool's statistics and
// its jobs by kind and outcome; with a metrics address, /metrics is served
// there and no longer on the main listener.
func TestBackendMetrics(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{MetricsAddr: "127.0.0.1:0", CallbackSchedule: fast()})
	metrics := "http://" + env.Backend.MetricsAddr() + "/metrics"
	code, body := scrape(t, env.URL+"/metrics")
	require.Equal(t, http.StatusNotFound, code, "not on the main listener: %s", body)
	code, _ = scrape(t, env.Backend.URL()+"/metrics")
	require.Equal(t, http.StatusNotFound, code, "nor on the backend's own address")
	code, body = scrape(t, env.URL+"/healthz")
	require.Equal(t, http.StatusOK, code, body)

	rc := newReceiver(t)
	_, out := submit(t, env, dev.PEPToken, map[string]any{"endpoint": rc.URL + "/cb"})
	approve(t, env, out["task"].(map[string]any)["id"].(string))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		code, body := scrape(c, metrics)
		require.Equal(c, http.StatusOK, code)
		v, ok := sample(body, `arap_db_pool_max_conns{pool="backend"}`)
		assert.True(c, ok && v != "0", "pool size: %q", v)
		_, ok = sample(body, `arap_db_pool_acquires_total{pool="backend"}`)
		assert.True(c, ok)
		v, _ = sample(body, `arap_river_jobs_total{kind="callbacks.deliver",outcome="completed"}`)
		assert.Equal(c, "1", v)
		_, ok = sample(body, `arap_river_job_duration_seconds_count{kind="callbacks.deliver"}`)
		assert.True(c, ok)
		assert.Contains(c, body, "arap_http_requests_total", "the process-wide metrics too")
	}, 30*time.Second, 50*time.Millisecond)
}
