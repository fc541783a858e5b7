// Command conformance runs the SEP-2848 (MCP tool approval) conformance
// scenarios against an MCP server:
//
//	go run ./conformance --url http://127.0.0.1:8481/mcp --token dev-agent-token \
//	    --other-token dev-agent2-token --limits-token dev-bob-agent-token \
//	    --decision-api http://127.0.0.1:8480 --decision-token dev-itsm-token \
//	    --allow-skip outcome-unknown,retry,expiry,approval-expiry,in-task-input
//
// Approvals are decided through an adapter the server under test provides:
// the arap backend's decision API (--decision-api), or any command
// (--resolve-cmd, given SEP2848_TASK_ID, SEP2848_DECISION, SEP2848_TOOL,
// SEP2848_ARGUMENTS and SEP2848_REASON). Which calls are gated, denied or
// need input is the --profile (default: the profile of `arapd dev`).
//
// Exit status: 0 every check passed, or was skipped and named by
// --allow-skip; 1 a check failed; 2 usage; 3 a check was skipped that
// --allow-skip does not name (a skip proves nothing, so it is not a pass
// unless you say so).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"time"

	"github.com/omcp/arap/conformance/sep2848"
)

func main() {
	fs := flag.NewFlagSet("conformance", flag.ExitOnError)
	url := fs.String("url", "http://127.0.0.1:8481/mcp", "the MCP endpoint under test")
	token := fs.String("token", os.Getenv("SEP2848_TOKEN"), "bearer token of the principal the scenarios act as (SEP2848_TOKEN)")
	other := fs.String("other-token", os.Getenv("SEP2848_OTHER_TOKEN"), "a second principal's token, for access control and dedup scope (SEP2848_OTHER_TOKEN)")
	limitsToken := fs.String("limits-token", os.Getenv("SEP2848_LIMITS_TOKEN"), "a third principal's token, spent on the per-caller limits: it stays at its submission rate for a minute after (SEP2848_LIMITS_TOKEN)")
	profile := fs.String("profile", "", "profile JSON naming the gated, denied and input calls (default: arapd dev's)")
	api := fs.String("decision-api", "", "resolve approvals through the arap decision API at this base URL")
	apiToken := fs.String("decision-token", os.Getenv("SEP2848_DECISION_TOKEN"), "decider token for --decision-api (SEP2848_DECISION_TOKEN)")
	cancelToken := fs.String("cancel-token", os.Getenv("SEP2848_CANCEL_TOKEN"), "with --decision-api: the requesting client's token, to cancel requests at the backend (SEP2848_CANCEL_TOKEN)")
	cmd := fs.String("resolve-cmd", "", "resolve approvals by running this shell command")
	backendURL := fs.String("backend-url", "", "the approval backend's URL, which must never appear in an MCP response (default: --decision-api)")
	only := fs.String("scenario", "", "run only these scenarios (comma-separated): "+strings.Join(sep2848.Scenarios(), ", "))
	checks := fs.String("check", "", "run only the scenarios holding these checks (comma-separated ids), and report only them")
	allow := fs.String("allow-skip", "", "checks (ids, with or without sep-2848-, or scenario names for all their checks) whose skipping is acceptable")
	timeout := fs.Duration("timeout", 2*time.Minute, "bound on each scenario, beyond the waits the profile declares")
	asJSON := fs.Bool("json", false, "print the results as JSON")
	_ = fs.Parse(os.Args[1:])

	p := sep2848.DevProfile()
	if *profile != "" {
		doc, err := os.ReadFile(*profile)
		if err == nil {
			p, err = sep2848.ParseProfile(doc)
		}
		if err != nil {
			usage("%v", err)
		}
	}
	var resolver sep2848.Resolver
	switch {
	case *api != "" && *cmd != "":
		usage("give --decision-api or --resolve-cmd, not both")
	case *api != "":
		resolver = &sep2848.DecisionAPI{URL: *api, Token: *apiToken, CancelToken: *cancelToken}
	case *cmd != "":
		resolver = &sep2848.Command{Line: *cmd}
	default:
		usage("an approval adapter is needed: --decision-api URL or --resolve-cmd CMD")
	}
	if *token == "" {
		usage("--token is required")
	}
	if *backendURL == "" {
		*backendURL = *api
	}
	cfg := sep2848.Config{URL: *url, Token: *token, OtherToken: *other, LimitsToken: *limitsToken, Profile: p, Resolver: resolver,
		BackendURL: *backendURL, Timeout: *timeout}
	for _, name := range list(*only) {
		if !slices.Contains(sep2848.Scenarios(), name) {
			usage("no scenario %q; the scenarios are: %s", name, strings.Join(sep2848.Scenarios(), ", "))
		}
		cfg.Scenarios = append(cfg.Scenarios, name)
	}
	wanted := list(*checks)
	for _, id := range wanted {
		s, ok := sep2848.ScenarioOf(id)
		if !ok {
			usage("no check %q", id)
		}
		if !slices.Contains(cfg.Scenarios, s) {
			cfg.Scenarios = append(cfg.Scenarios, s)
		}
	}
	allowed := list(*allow)
	for i, a := range allowed {
		if _, ok := sep2848.ScenarioOf("sep-2848-" + a); ok {
			allowed[i] = "sep-2848-" + a // a check id without its prefix
		} else if _, ok := sep2848.ScenarioOf(a); !ok && !slices.Contains(sep2848.Scenarios(), a) {
			usage("--allow-skip: %q is neither a check nor a scenario", a)
		}
	}
	if !*asJSON {
		cfg.Log = os.Stdout
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	results := sep2848.Run(ctx, cfg)
	if len(wanted) > 0 {
		results = slices.DeleteFunc(results, func(r sep2848.Result) bool { return !slices.Contains(wanted, r.ID) })
	}
	passed, failed, skipped := sep2848.Summary(results)
	unallowed := unallowedSkips(results, allowed)
	if *asJSON {
		_ = json.NewEncoder(os.Stdout).Encode(map[string]any{"results": results, "passed": passed, "failed": failed, "skipped": skipped,
			"unallowed_skips": unallowed})
	} else {
		fmt.Printf("\nSEP-2848 conformance: %d passed, %d failed, %d skipped (of %d checks)\n", passed, failed, skipped, len(results))
		for _, r := range results {
			if r.Outcome == sep2848.Failed {
				fmt.Printf("FAILED %s: %s\n", r.ID, r.Detail)
			}
		}
		for _, r := range results {
			if slices.Contains(unallowed, r.ID) {
				fmt.Printf("SKIPPED %s: %s\n", r.ID, r.Detail)
			}
		}
		if len(unallowed) > 0 {
			fmt.Printf("%d skipped checks are not named by --allow-skip: a skip is not a pass\n", len(unallowed))
		}
	}
	os.Exit(exitCode(failed, unallowed))
}

// unallowedSkips lists the skipped checks that allowed (check ids or
// scenario names) does not name.
func unallowedSkips(results []sep2848.Result, allowed []string) []string {
	var out []string
	for _, r := range results {
		if r.Outcome == sep2848.Skipped && !slices.Contains(allowed, r.ID) && !slices.Contains(allowed, r.Scenario) {
			out = append(out, r.ID)
		}
	}
	return out
}

// exitCode is the command's exit status: a failure outranks a skip.
func exitCode(failed int, unallowed []string) int {
	switch {
	case failed > 0:
		return 1
	case len(unallowed) > 0:
		return 3
	}
	return 0
}

func list(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

func usage(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "conformance: "+format+"\n", args...)
	os.Exit(2)
}
