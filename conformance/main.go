// Command conformance runs the SEP-2848 (MCP tool approval) conformance
// scenarios against an MCP server:
//
//	go run ./conformance --url http://127.0.0.1:8481/mcp --token dev-alice-agent-token \
//	    --other-token dev-bob-agent-token --decision-api http://127.0.0.1:8480 --decision-token dev-itsm-token
//
// Approvals are decided through an adapter the server under test provides:
// the arap backend's decision API (--decision-api), or any command
// (--resolve-cmd, given SEP2848_TASK_ID, SEP2848_DECISION, SEP2848_TOOL,
// SEP2848_ARGUMENTS and SEP2848_REASON). Which calls are gated, denied or
// need input is the --profile (default: the profile of `arapd dev`).
// Exit status: 0 all checks passed (or skipped), 1 a check failed, 2 usage.
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
	profile := fs.String("profile", "", "profile JSON naming the gated, denied and input calls (default: arapd dev's)")
	api := fs.String("decision-api", "", "resolve approvals through the arap decision API at this base URL")
	apiToken := fs.String("decision-token", os.Getenv("SEP2848_DECISION_TOKEN"), "decider token for --decision-api (SEP2848_DECISION_TOKEN)")
	cmd := fs.String("resolve-cmd", "", "resolve approvals by running this shell command")
	backendURL := fs.String("backend-url", "", "the approval backend's URL, which must never appear in an MCP response (default: --decision-api)")
	only := fs.String("scenario", "", "run only these scenarios (comma-separated): "+strings.Join(sep2848.Scenarios(), ", "))
	timeout := fs.Duration("timeout", 2*time.Minute, "bound on each scenario")
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
		resolver = &sep2848.DecisionAPI{URL: *api, Token: *apiToken}
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
	cfg := sep2848.Config{URL: *url, Token: *token, OtherToken: *other, Profile: p, Resolver: resolver,
		BackendURL: *backendURL, Timeout: *timeout}
	if *only != "" {
		for _, name := range strings.Split(*only, ",") {
			name = strings.TrimSpace(name)
			if !slices.Contains(sep2848.Scenarios(), name) {
				usage("no scenario %q; the scenarios are: %s", name, strings.Join(sep2848.Scenarios(), ", "))
			}
			cfg.Scenarios = append(cfg.Scenarios, name)
		}
	}
	if !*asJSON {
		cfg.Log = os.Stdout
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	results := sep2848.Run(ctx, cfg)
	passed, failed, skipped := sep2848.Summary(results)
	if *asJSON {
		_ = json.NewEncoder(os.Stdout).Encode(map[string]any{"results": results, "passed": passed, "failed": failed, "skipped": skipped})
	} else {
		fmt.Printf("\nSEP-2848 conformance: %d passed, %d failed, %d skipped (of %d checks)\n", passed, failed, skipped, len(results))
		for _, r := range results {
			if r.Outcome == sep2848.Failed {
				fmt.Printf("FAILED %s: %s\n", r.ID, r.Detail)
			}
		}
	}
	if failed > 0 {
		os.Exit(1)
	}
}

func usage(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "conformance: "+format+"\n", args...)
	os.Exit(2)
}
