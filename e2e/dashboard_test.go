package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
)

// TestGrafanaDashboardNamesExportedSeries: every query of the dashboard in
// deploy/grafana names series that arapd's two processes export, with the
// labels it groups and filters by. arapd dev runs a gated call to its end
// (evaluation, request, notification, approval, callback, task) so that
// every series has samples; then both /metrics are scraped.
func TestGrafanaDashboardNamesExportedSeries(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../deploy/grafana/arap.json")
	require.NoError(t, err)
	var doc struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	require.NoError(t, json.Unmarshal(raw, &doc))
	require.NotEmpty(t, doc.Panels)

	d := startDev(t, dbtest.URL(t))
	agent := append([]string{"ARAP_MCP_TOKEN=" + dev.AgentToken}, d.env...)
	code, out := startArapctl(t, agent, "mcp", "call", "get_balance").exit(t)
	require.Equal(t, 0, code, out)
	code, out = startArapctl(t, agent, "mcp", "call", "wire_transfer", "--arg", "to=acct-991", "--arg", "amount=60000", "--no-wait").exit(t)
	require.Equal(t, 0, code, out)
	approveOnlyPending(t, d.api)
	code, out = startArapctl(t, agent, "mcp", "wait").exit(t)
	require.Equal(t, 0, code, out)

	mcpBase := strings.TrimSuffix(d.mcpURL, "/mcp")
	type series struct{ labels map[string]bool }
	scrape := func() map[string]*series {
		got := map[string]*series{}
		for _, base := range []string{d.p.url(), mcpBase} {
			resp, err := http.Get(base + "/metrics")
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s/metrics", base)
			for _, line := range strings.Split(string(body), "\n") {
				if line == "" || line[0] == '#' {
					continue
				}
				name, rest, _ := strings.Cut(line, "{")
				name = strings.Fields(name)[0]
				s := got[name]
				if s == nil {
					s = &series{labels: map[string]bool{}}
					got[name] = s
				}
				if labels, _, ok := strings.Cut(rest, "}"); ok {
					for _, m := range labelName.FindAllStringSubmatch(labels, -1) {
						s.labels[m[1]] = true
					}
				}
			}
		}
		return got
	}
	// The notification and the callback are sent after the call's end is
	// reported; the leader's gauges appear once it is elected: wait for
	// every series the dashboard names to have samples.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		got := scrape()
		for _, p := range doc.Panels {
			for _, tg := range p.Targets {
				names := metricName.FindAllString(tg.Expr, -1)
				if !assert.NotEmpty(c, names, "%q: %s names no arap series", p.Title, tg.Expr) {
					continue
				}
				for _, name := range names {
					s := got[name]
					if !assert.NotNil(c, s, "%q: %s: no series %s is exported", p.Title, tg.Expr, name) {
						continue
					}
					for _, l := range labelsUsed(tg.Expr) {
						assert.True(c, s.labels[l], "%q: %s: %s has no label %s", p.Title, tg.Expr, name, l)
					}
				}
			}
		}
	}, 60*time.Second, 200*time.Millisecond)
}

var (
	metricName = regexp.MustCompile(`\barap_[a-z0-9_]+`)
	labelName  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="`)
	byClause   = regexp.MustCompile(`\bby \(([^)]*)\)`)
	matcher    = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*"`)
)

// labelsUsed lists the labels expr groups by or matches on.
func labelsUsed(expr string) []string {
	var out []string
	for _, m := range byClause.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(m[1], ",") {
			out = append(out, strings.TrimSpace(l))
		}
	}
	for _, sel := range regexp.MustCompile(`\{([^}]*)\}`).FindAllStringSubmatch(expr, -1) {
		for _, m := range matcher.FindAllStringSubmatch(sel[1], -1) {
			out = append(out, m[1])
		}
	}
	return out
}
