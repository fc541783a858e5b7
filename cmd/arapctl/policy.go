package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"go.yaml.in/yaml/v3"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/pep"
	"github.com/omcp/arap/upstream"
)

// policyCheck: arapctl policy check FILE. Offline: the file is parsed and
// compiled as arapd serve would, then evaluation.Check reads every property
// path its conditions read against the tools' input schemas (the demo
// tools', or the upstreams' with --upstreams), and the groups and users of
// --directory. Each problem is FILE:LINE: reason.
func policyCheck(fs *flag.FlagSet) action {
	upstreams := fs.String("upstreams", "", "type tool arguments by these upstreams' tools (arapd mcp's upstreams file; they are connected to list them) instead of the demo tools'")
	directory := fs.String("directory", "", "a YAML file of the directory (groups: {GROUP: [USER, ...]}, users: [USER, ...]) that approvals must name")
	return func(s streams, pos []string) error {
		p, err := evaluation.LoadFile(pos[0])
		if err != nil {
			return printProblems(s, err)
		}
		env := evaluation.CheckEnv{Tools: map[string]map[string]any{}}
		if *upstreams != "" {
			if env.Tools, err = upstreamSchemas(*upstreams, s); err != nil {
				return err
			}
		} else {
			for _, t := range pep.DemoTools() {
				env.Tools[t.Name] = t.InputSchema
			}
		}
		if *directory != "" {
			if env.Groups, env.Users, err = readDirectory(*directory); err != nil {
				return err
			}
		}
		errs := 0
		for _, f := range evaluation.Check(p, env) {
			kind := ""
			if f.Note {
				kind = "note: "
			} else {
				errs++
			}
			fmt.Fprintf(s.out, "%s:%d: %s%s\n", pos[0], f.Line, kind, f.Message)
		}
		if errs > 0 {
			return fmt.Errorf("policy %s: %d problem(s)", pos[0], errs)
		}
		fmt.Fprintf(s.out, "policy %s: %d rules, no problems\n", pos[0], len(p.Rules))
		return nil
	}
}

// printProblems prints a policy's load errors one per line.
func printProblems(s streams, err error) error {
	var perr *evaluation.Error
	if !errors.As(err, &perr) {
		return err
	}
	for _, p := range perr.Problems {
		fmt.Fprintf(s.out, "%s:%d: %s\n", perr.Source, p.Line, p.Message)
	}
	return fmt.Errorf("%s %s: %d problem(s)", perr.What, perr.Source, len(perr.Problems))
}

// upstreamSchemas connects to the upstreams of file and returns their tools'
// input schemas by exposed name, once every upstream has answered or a
// minute has passed.
func upstreamSchemas(file string, s streams) (map[string]map[string]any, error) {
	cfg, err := upstream.Load(file)
	if err != nil {
		return nil, err
	}
	reg := upstream.New(upstream.Options{Client: &sdk.Implementation{Name: "arapctl", Version: "0.1.0"}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer func() { _ = reg.Close(context.Background()) }()
	if err := reg.Reload(ctx, cfg); err != nil {
		return nil, err
	}
	for ctx.Err() == nil {
		waiting := false
		for _, st := range reg.Status() {
			if !st.Connected && st.Err != nil && st.Err.Error() == "connecting" {
				waiting = true
			}
		}
		if !waiting {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond): // polling the registry's status
		}
	}
	for _, st := range reg.Status() {
		if !st.Connected {
			fmt.Fprintf(s.note, "note: upstream %s is not connected (%v): its tools' arguments are not checked\n", st.Name, st.Err)
		}
	}
	out := map[string]map[string]any{}
	for _, t := range reg.Tools() {
		schema, _ := toMap(t.Def.InputSchema)
		out[t.Name] = schema
	}
	return out, nil
}

// toMap is a schema as a JSON object.
func toMap(v any) (map[string]any, error) {
	if m, ok := v.(map[string]any); ok {
		return m, nil
	}
	b, err := yaml.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	return m, yaml.Unmarshal(b, &m)
}

// readDirectory reads a directory file: the groups with their members, and
// any other users.
func readDirectory(file string) (groups, users map[string]bool, err error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, err
	}
	var d struct {
		Groups map[string][]string `yaml:"groups"`
		Users  []string            `yaml:"users"`
	}
	if err := yaml.Unmarshal(raw, &d); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", file, err)
	}
	groups, users = map[string]bool{}, map[string]bool{}
	for g, members := range d.Groups {
		groups[g] = true
		for _, m := range members {
			users[m] = true
		}
	}
	for _, u := range d.Users {
		users[u] = true
	}
	return groups, users, nil
}

// policyTest: arapctl policy test POLICY CASES, offline.
func policyTest(fs *flag.FlagSet) action {
	return func(s streams, pos []string) error {
		p, err := evaluation.LoadFile(pos[0])
		if err != nil {
			return printProblems(s, err)
		}
		raw, err := os.ReadFile(pos[1])
		if err != nil {
			return err
		}
		cases, err := evaluation.ParseCases(pos[1], raw)
		if err != nil {
			return printProblems(s, err)
		}
		outcomes, err := evaluation.RunCases(context.Background(), p, cases)
		if err != nil {
			return err
		}
		if !evaluation.Report(s.out, pos[1], outcomes) {
			return fmt.Errorf("policy %s: cases %s failed", pos[0], pos[1])
		}
		return nil
	}
}

// policyReload asks the backend to reload its policy on every replica.
func policyReload(fs *flag.FlagSet) action {
	a := apiFlags(fs)
	return func(s streams, _ []string) error {
		c, err := a.client()
		if err != nil {
			return err
		}
		r, err := c.ReloadPolicy(context.Background())
		var pe *arapclient.ProblemError
		if errors.As(err, &pe) && len(pe.Problem.Errors) > 0 {
			for _, line := range pe.Problem.Errors {
				fmt.Fprintln(s.out, line)
			}
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(s.out, "policy %s reloaded: %d rules", r.Policy, r.Rules)
		if r.Announced {
			fmt.Fprint(s.out, "; every replica reloads it")
		} else {
			fmt.Fprint(s.out, "; the other replicas could not be told: send them SIGHUP")
		}
		fmt.Fprintln(s.out)
		return nil
	}
}
