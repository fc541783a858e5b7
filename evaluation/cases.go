package evaluation

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/yamlfile"
)

// Test cases of a policy (`arapctl policy test POLICY CASES`), like `opa
// test` for arap's rules: each case is an evaluation as a PEP would ask it
// (who, through which agents, which tool with which arguments, at what
// time, with which deployment attributes) and the decision expected.
//
//	cases:
//	  - name: a large transfer needs treasury
//	    subject: alice             # or {type: user, id: alice, properties: {...}}
//	    actors: [agent:demo]       # the act chain, acting actor first
//	    tool: wire_transfer
//	    arguments: {to: acct-1, amount: 50000}
//	    upstream: bank             # optional: the upstream and its tool
//	    annotations: {destructiveHint: true}
//	    attributes: {change_freeze: false}
//	    subject_attributes: {department: finance}
//	    at: 2026-12-07T10:00:00Z   # default: now
//	    expect:
//	      decision: request        # allow, deny or request
//	      rule: wire_transfer_large
//	      quorum: 1
//	      groups: [treasury]
//	      resolver: change_window  # a request an automated resolver decides

// Case is one test case.
type Case struct {
	Line              int            `yaml:"-"`
	Name              string         `yaml:"name"`
	Subject           any            `yaml:"subject"`
	Actors            []string       `yaml:"actors"`
	Tool              string         `yaml:"tool"`
	Action            string         `yaml:"action"`
	Arguments         map[string]any `yaml:"arguments"`
	Upstream          string         `yaml:"upstream"`
	UpstreamTool      string         `yaml:"upstream_tool"`
	Annotations       map[string]any `yaml:"annotations"`
	Context           map[string]any `yaml:"context"`
	Attributes        map[string]any `yaml:"attributes"`
	SubjectAttributes map[string]any `yaml:"subject_attributes"`
	At                time.Time      `yaml:"at"`
	Expect            Expectation    `yaml:"expect"`
}

// Expectation is what a case expects; unset members are not checked.
type Expectation struct {
	Decision string   `yaml:"decision"`
	Rule     string   `yaml:"rule"`
	Quorum   int      `yaml:"quorum"`
	Groups   []string `yaml:"groups"`
	Resolver string   `yaml:"resolver"`
}

// CaseOutcome is one case's result: the differences between what it expects
// and what the policy decides (none: it passes).
type CaseOutcome struct {
	Case  Case
	Got   Expectation
	Diffs []string
}

// ParseCases reads a cases file, every problem with its line.
func ParseCases(source string, doc []byte) ([]Case, error) {
	perr := &yamlfile.Error{What: "policy cases", Source: source}
	var f struct {
		Cases []Case `yaml:"cases"`
	}
	if !yamlfile.Decode(doc, &f, perr) {
		return nil, perr
	}
	lines := yamlfile.ItemLines(doc, "cases")
	for i := range f.Cases {
		c := &f.Cases[i]
		if i < len(lines) {
			c.Line = lines[i]
		}
		if c.Name == "" {
			perr.Add(c.Line, "case %d has no name", i+1)
		}
		if c.Subject == nil {
			perr.Add(c.Line, "case %q: subject is required", c.Name)
		}
		if c.Tool == "" {
			perr.Add(c.Line, "case %q: tool is required", c.Name)
		}
		switch c.Expect.Decision {
		case EffectAllow, EffectDeny, EffectRequest:
		default:
			perr.Add(c.Line, "case %q: expect.decision must be allow, deny or request, got %q", c.Name, c.Expect.Decision)
		}
	}
	if len(f.Cases) == 0 {
		perr.Add(0, "no cases")
	}
	return f.Cases, perr.Err()
}

// Request is the evaluation request a PEP sends for c.
func (c Case) Request() (authzen.EvaluationRequest, error) {
	subject := authzen.Object{}
	switch s := c.Subject.(type) {
	case string:
		subject["type"], subject["id"] = "user", s
	case map[string]any:
		for k, v := range s {
			subject[k] = v
		}
		if _, ok := subject["type"]; !ok {
			subject["type"] = "user"
		}
	default:
		return authzen.EvaluationRequest{}, fmt.Errorf("case %q: subject must be an id or an object", c.Name)
	}
	if len(c.Actors) > 0 {
		var act map[string]any
		for i := len(c.Actors) - 1; i >= 0; i-- {
			link := map[string]any{"sub": c.Actors[i]}
			if act != nil {
				link["act"] = act
			}
			act = link
		}
		props, _ := subject["properties"].(map[string]any)
		if props == nil {
			props = map[string]any{}
		}
		props["act"] = act
		subject["properties"] = props
	}
	args := c.Arguments
	if args == nil {
		args = map[string]any{}
	}
	props := map[string]any{"arguments": jsonCompatible(args)}
	if c.Upstream != "" {
		props["upstream"], props["upstream_tool"] = c.Upstream, c.UpstreamTool
		if c.UpstreamTool == "" {
			props["upstream_tool"] = c.Tool
		}
	}
	if c.Annotations != nil {
		props["annotations"] = c.Annotations
	}
	action := c.Action
	if action == "" {
		action = "tools/call"
	}
	req := authzen.EvaluationRequest{Subject: subject, Action: authzen.Object{"name": action},
		Resource: authzen.Object{"type": "mcp_tool", "id": c.Tool, "properties": props}}
	if c.Context != nil {
		req.Context = authzen.Object(jsonCompatible(c.Context).(map[string]any))
	}
	return req, nil
}

// RunCases decides every case under p.
func RunCases(ctx context.Context, p *Policy, cases []Case) ([]CaseOutcome, error) {
	out := make([]CaseOutcome, 0, len(cases))
	for _, c := range cases {
		req, err := c.Request()
		if err != nil {
			return nil, err
		}
		at := c.At
		if at.IsZero() {
			at = time.Now()
		}
		tr, err := Try(ctx, p, req, TrialInputs{Attributes: c.Attributes, SubjectAttributes: c.SubjectAttributes, Now: at.UTC()})
		o := CaseOutcome{Case: c}
		if err != nil {
			o.Diffs = []string{"the policy failed to decide: " + err.Error() + " (it would deny)"}
			out = append(out, o)
			continue
		}
		o.Got = Expectation{Decision: EffectDeny}
		if tr.Rule != nil {
			o.Got.Decision, o.Got.Rule = tr.Rule.Effect, tr.Rule.Name
			if tr.Rule.Effect == EffectRequest {
				o.Got.Quorum, o.Got.Groups = tr.Rule.Approval.Quorum, tr.Rule.Approval.Groups
			}
			if tr.Resolver != nil {
				o.Got.Resolver = tr.Resolver.Name
			}
		}
		e := c.Expect
		diff := func(what string, want, got any) {
			o.Diffs = append(o.Diffs, fmt.Sprintf("%s: want %v, got %v", what, want, got))
		}
		if e.Decision != o.Got.Decision {
			diff("decision", e.Decision, o.Got.Decision+ruleOf(o.Got.Rule))
		}
		if e.Rule != "" && e.Rule != o.Got.Rule {
			diff("rule", e.Rule, orNone(o.Got.Rule))
		}
		if e.Quorum != 0 && e.Quorum != o.Got.Quorum {
			diff("quorum", e.Quorum, o.Got.Quorum)
		}
		if e.Groups != nil && !slices.Equal(sorted(e.Groups), sorted(o.Got.Groups)) {
			diff("groups", e.Groups, o.Got.Groups)
		}
		if e.Resolver != "" && e.Resolver != o.Got.Resolver {
			diff("resolver", e.Resolver, orNone(o.Got.Resolver))
		}
		out = append(out, o)
	}
	return out, nil
}

func ruleOf(r string) string {
	if r == "" {
		return " (no rule matched)"
	}
	return " (rule " + r + ")"
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func sorted(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}

// Report writes outcomes as a reader wants them: a line per case, the
// differences of a failing one beneath it, and a total; it reports whether
// every case passed.
func Report(w interface{ Write([]byte) (int, error) }, source string, outcomes []CaseOutcome) bool {
	failed := 0
	var b strings.Builder
	for _, o := range outcomes {
		if len(o.Diffs) == 0 {
			fmt.Fprintf(&b, "PASS %s\n", o.Case.Name)
			continue
		}
		failed++
		fmt.Fprintf(&b, "FAIL %s (%s:%d)\n", o.Case.Name, source, o.Case.Line)
		for _, d := range o.Diffs {
			fmt.Fprintf(&b, "     %s\n", d)
		}
	}
	fmt.Fprintf(&b, "%d cases, %d passed, %d failed\n", len(outcomes), len(outcomes)-failed, failed)
	_, _ = w.Write([]byte(b.String()))
	return failed == 0
}
