package evaluation

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/ext"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"

	"github.com/omcp/arap/internal/yamlfile"
)

// Effects a rule can have.
const (
	EffectAllow   = "allow"   // decision true
	EffectDeny    = "deny"    // decision false, not requestable
	EffectRequest = "request" // decision false, requestable: access can be asked for
)

// Policy is a compiled policy file. It is immutable; reloading builds a new one.
type Policy struct {
	Source   string // file name, for messages
	Defaults Defaults
	Rules    []*Rule
	Windows  map[string]*Window
	// Definitions are the named CEL expressions conditions may read.
	Definitions map[string]*Definition
	// SubjectAttributes says where subject_attributes comes from; nil when
	// the policy does not use it.
	SubjectAttributes *SubjectAttributes
	// Expects are property paths the policy's conditions may read beyond
	// those Check knows (a subject property a PEP sends, an argument its
	// tool's schema does not name), e.g. resource.properties.arguments.memo.
	Expects []string
	byName  map[string]*Rule
}

// Rule returns the named rule.
func (p *Policy) Rule(name string) (*Rule, bool) {
	r, ok := p.byName[name]
	return r, ok
}

// Defaults apply to rules that do not set their own values.
type Defaults struct {
	DenialTTL  Duration `yaml:"denial_ttl"`  // lifetime of a requestable denial and its binding_token
	RequestTTL Duration `yaml:"request_ttl"` // how long a submitted request may stay pending
}

// Rule is one compiled rule. Rules are tried in file order; the first whose
// match and condition hold decides. No match means deny, not requestable.
type Rule struct {
	Line        int // where the rule starts in its file
	Name        string
	Description string
	Match       Match
	When        Expr
	Effect      string
	Reason      string
	// Requestable rules only:
	Template       string         // opaque routing id sent as access_request.template
	Display        map[string]any // UI hints for the PEP and the approver
	ContextMembers []string       // authorization-relevant context members (binding_context_members)
	DenialTTL      time.Duration
	RequestTTL     time.Duration
	// RequestSchema describes what a submission must add (context and
	// requested_access); nil means nothing beyond the denied evaluation.
	RequestSchema map[string]any
	// Approval says who decides and how; Resolvers decide automatically.
	Approval       ApprovalPolicy
	Resolvers      []*Resolver
	compiledSchema *jsonschema.Schema
	program        cel.Program
}

// Match is a cheap pre-filter on exact values; empty fields match anything.
type Match struct {
	Action string `yaml:"action"`
	// Actions matches any of several action names (a rule covering several
	// actions); it excludes Action.
	Actions      []string `yaml:"actions"`
	ResourceType string   `yaml:"resource_type"`
	ResourceID   string   `yaml:"resource_id"`
	SubjectType  string   `yaml:"subject_type"`
}

// Expr is a CEL expression with the line it came from.
type Expr struct {
	Src  string
	Line int
}

// UnmarshalYAML keeps the line number for error messages.
func (e *Expr) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: expected a CEL expression string", n.Line)
	}
	e.Src, e.Line = n.Value, n.Line
	return nil
}

// Duration is a time.Duration written as "10m", "24h".
type Duration struct {
	time.Duration
	Line int
}

// UnmarshalYAML parses a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil || v <= 0 {
		return fmt.Errorf("line %d: %q is not a positive duration (e.g. 10m, 24h)", n.Line, n.Value)
	}
	d.Duration, d.Line = v, n.Line
	return nil
}

type fileSpec struct {
	Version           int                    `yaml:"version"`
	Defaults          Defaults               `yaml:"defaults"`
	Windows           map[string]windowSpec  `yaml:"windows"`
	SubjectAttributes *subjectAttributesSpec `yaml:"subject_attributes"`
	Definitions       map[string]Expr        `yaml:"definitions"`
	Expects           []string               `yaml:"expects"`
	Rules             []ruleSpec             `yaml:"rules"`
}

type ruleSpec struct {
	Line           int            `yaml:"-"`
	Name           string         `yaml:"name"`
	Description    string         `yaml:"description"`
	Match          Match          `yaml:"match"`
	When           Expr           `yaml:"when"`
	Effect         string         `yaml:"effect"`
	Reason         string         `yaml:"reason"`
	Template       string         `yaml:"template"`
	Display        map[string]any `yaml:"display"`
	ContextMembers []string       `yaml:"context_members"`
	DenialTTL      Duration       `yaml:"denial_ttl"`
	RequestTTL     Duration       `yaml:"request_ttl"`
	RequestSchema  map[string]any `yaml:"request_schema"`
	Approval       *approvalSpec  `yaml:"approval"`
	Notify         *notifySpec    `yaml:"notify"`
}

func (r *ruleSpec) UnmarshalYAML(n *yaml.Node) error {
	// Node.Decode cannot reject unknown keys, so check them here, with lines.
	if err := checkKeys(n, ruleKeys, "rule"); err != nil {
		return err
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == "match" {
			if err := checkKeys(n.Content[i+1], matchKeys, "match"); err != nil {
				return err
			}
		}
	}
	type plain ruleSpec
	var p plain
	if err := n.Decode(&p); err != nil {
		return err
	}
	*r = ruleSpec(p)
	r.Line = n.Line
	return nil
}

var (
	ruleKeys = []string{"name", "description", "match", "when", "effect", "reason", "template", "display",
		"context_members", "denial_ttl", "request_ttl", "request_schema", "approval", "notify"}
	matchKeys = []string{"action", "actions", "resource_type", "resource_id", "subject_type"}
)

func checkKeys(n *yaml.Node, known []string, what string) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: %s must be a mapping", n.Line, what)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		if !slices.Contains(known, k.Value) {
			return fmt.Errorf("line %d: unknown %s field %q (known: %s)", k.Line, what, k.Value, strings.Join(known, ", "))
		}
	}
	return nil
}

// Error lists every problem found in a policy file, each with its line.
type Error = yamlfile.Error

// Problem is one error at one line.
type Problem = yamlfile.Problem

var (
	nameRE   = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)
	reasonRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)
)

// LoadFile reads and compiles a policy file.
func LoadFile(path string) (*Policy, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	return Parse(path, b)
}

// Parse compiles a policy document. All problems are reported at once.
func Parse(source string, doc []byte) (*Policy, error) {
	perr := &Error{What: "policy", Source: source}
	add := perr.Add
	var spec fileSpec
	if !yamlfile.Decode(doc, &spec, perr) {
		return nil, perr
	}
	if spec.Version != 1 {
		add(1, "version must be 1, got %d", spec.Version)
	}
	p := &Policy{Source: source, Defaults: spec.Defaults, byName: map[string]*Rule{}, Windows: map[string]*Window{}, Expects: spec.Expects}
	for name, ws := range spec.Windows {
		if !nameRE.MatchString(name) {
			add(ws.Line, "window name %q must be lower_snake_case", name)
			continue
		}
		w, err := compileWindow(name, ws)
		if err != nil {
			add(ws.Line, "%v", err)
			continue
		}
		p.Windows[name] = w
	}
	if p.Defaults.DenialTTL.Duration == 0 {
		p.Defaults.DenialTTL.Duration = 10 * time.Minute
	}
	if p.Defaults.RequestTTL.Duration == 0 {
		p.Defaults.RequestTTL.Duration = 24 * time.Hour
	}
	p.SubjectAttributes = compileSubjectAttributes(source, spec.SubjectAttributes, add)
	env, err := newCELEnv(spec.SubjectAttributes != nil)
	if err != nil {
		return nil, err
	}
	env, p.Definitions = compileDefinitions(env, spec.Definitions, add)
	for _, rs := range spec.Rules {
		r, problems := compileRule(env, p.Defaults, rs)
		perr.Problems = append(perr.Problems, problems...)
		if r == nil {
			continue
		}
		if _, dup := p.byName[r.Name]; dup {
			add(rs.Line, "rule %q is defined twice", r.Name)
			continue
		}
		p.byName[r.Name] = r
		p.Rules = append(p.Rules, r)
	}
	if len(perr.Problems) > 0 {
		return nil, perr
	}
	return p, nil
}

func compileRule(env *cel.Env, d Defaults, rs ruleSpec) (*Rule, []Problem) {
	var ps []Problem
	add := func(line int, format string, args ...any) {
		ps = append(ps, Problem{Line: line, Message: fmt.Sprintf("rule %q: ", rs.Name) + fmt.Sprintf(format, args...)})
	}
	if !nameRE.MatchString(rs.Name) {
		add(rs.Line, "name must be lower_snake_case (a-z, 0-9, _), at most 63 characters")
	}
	r := &Rule{
		Line: rs.Line, Name: rs.Name, Description: rs.Description, Match: rs.Match, When: rs.When, Effect: rs.Effect,
		Reason: rs.Reason, Template: rs.Template, Display: rs.Display, ContextMembers: rs.ContextMembers,
		DenialTTL: rs.DenialTTL.Duration, RequestTTL: rs.RequestTTL.Duration, RequestSchema: rs.RequestSchema,
	}
	switch r.Effect {
	case EffectAllow, EffectDeny, EffectRequest:
	default:
		add(rs.Line, "effect must be allow, deny or request, got %q", r.Effect)
	}
	if r.Reason == "" {
		switch r.Effect {
		case EffectRequest:
			r.Reason = "approval_required"
		case EffectDeny:
			r.Reason = "policy_denied"
		}
	} else if !reasonRE.MatchString(r.Reason) {
		add(rs.Line, "reason must be a lower_snake_case code")
	}
	if r.Effect != EffectRequest {
		if r.Template != "" || r.Display != nil || r.ContextMembers != nil || r.RequestSchema != nil || r.DenialTTL != 0 || r.RequestTTL != 0 || rs.Approval != nil || rs.Notify != nil {
			add(rs.Line, "template, display, context_members, request_schema, denial_ttl, request_ttl, approval and notify apply only to effect: request")
		}
	} else if rs.Approval == nil {
		add(rs.Line, "effect: request needs an approval section saying who may decide (groups, users, clients, kinds or resolvers)")
	} else {
		r.Approval, r.Resolvers = compileApproval(env, *rs.Approval, add)
		r.Approval.Notify = compileNotify(rs.Notify, add)
	}
	if r.Template == "" {
		r.Template = r.Name
	}
	if r.DenialTTL == 0 {
		r.DenialTTL = d.DenialTTL.Duration
	}
	if r.RequestTTL == 0 {
		r.RequestTTL = d.RequestTTL.Duration
	}
	if rs.Approval != nil {
		if e := r.Approval.EscalateAfter; e != 0 && e >= r.RequestTTL {
			add(rs.Approval.EscalateAfter.Line, "approval.escalate_after (%s) is not shorter than request_ttl (%s), so the request would expire first", e, r.RequestTTL)
		}
		if e := r.Approval.RemindEvery; e != 0 && e >= r.RequestTTL {
			add(rs.Approval.RemindEvery.Line, "approval.remind_every (%s) is not shorter than request_ttl (%s), so no reminder would be sent", e, r.RequestTTL)
		}
	}
	if r.ContextMembers == nil {
		r.ContextMembers = []string{}
	}
	for _, m := range r.ContextMembers {
		if m == "" || slices.Contains(machineryMembers, m) {
			add(rs.Line, "context_members may not include %q: it is protocol machinery, not an authorization input", m)
		}
	}
	if r.Match.Action != "" && r.Match.Actions != nil {
		add(rs.Line, "match: give action or actions, not both")
	}
	if r.Match.Actions != nil {
		if len(r.Match.Actions) == 0 {
			add(rs.Line, "match.actions is empty; list the action names the rule covers")
		}
		for _, a := range r.Match.Actions {
			if a == "" {
				add(rs.Line, "match.actions has an empty action name")
			}
		}
	}
	if r.Match.empty() && r.When.Src == "" {
		add(rs.Line, "needs match or when (a rule that matches everything should say when: \"true\")")
	}
	if r.When.Src != "" {
		prg, err := compileCondition(env, r.When.Src)
		if err != nil {
			add(r.When.Line, "when: %v", err)
		}
		r.program = prg
	}
	if r.RequestSchema != nil {
		c := jsonschema.NewCompiler()
		c.DefaultDraft(jsonschema.Draft2020)
		url := "urn:arap:schema:" + r.Name
		if err := c.AddResource(url, jsonCompatible(r.RequestSchema)); err != nil {
			add(rs.Line, "request_schema: %v", err)
		} else if sch, err := c.Compile(url); err != nil {
			add(rs.Line, "request_schema: %s", oneLine(err.Error()))
		} else {
			r.compiledSchema = sch
			r.RequestSchema = jsonCompatible(r.RequestSchema).(map[string]any)
		}
	}
	if r.Effect == EffectRequest {
		r.Approval.DeclaredContext = declaredContext(r.RequestSchema, r.ContextMembers)
	}
	return r, ps
}

// declaredContext is the sorted set of context members a rule names: the
// properties (and required names) of its request_schema's context, and its
// binding context_members. A schema that names members only indirectly
// ($ref, allOf, patternProperties) declares nothing by them: such members
// are then treated as extra, which hides them from automated resolvers
// rather than trusting them.
func declaredContext(schema map[string]any, bound []string) []string {
	out := slices.Clone(bound)
	props, _ := schema["properties"].(map[string]any)
	ctx, _ := props["context"].(map[string]any)
	if names, ok := ctx["properties"].(map[string]any); ok {
		for n := range names {
			out = append(out, n)
		}
	}
	if req, ok := ctx["required"].([]any); ok {
		for _, n := range req {
			if s, ok := n.(string); ok {
				out = append(out, s)
			}
		}
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) == 0 {
		return nil
	}
	return out
}

var machineryMembers = []string{"access_request", "evaluation_id", "evaluated_at", "reason", "approval"}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// jsonCompatible converts YAML-decoded values (ints, nested maps) to the
// shapes encoding/json produces (float64, map[string]any).
func jsonCompatible(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, val := range x {
			out[k] = jsonCompatible(val)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, val := range x {
			out[i] = jsonCompatible(val)
		}
		return out
	case int:
		return float64(x)
	case int64:
		return float64(x)
	case uint64:
		return float64(x)
	default:
		return v
	}
}

const celCostLimit = 100000

func newCELEnv(subjectAttributes bool) (*cel.Env, error) {
	opts := append(functions(), celVars(subjectAttributes)...)
	return cel.NewEnv(append(opts,
		cel.CrossTypeNumericComparisons(true),
		cel.OptionalTypes(),
		ext.Strings(),
	)...)
}

func (m Match) empty() bool {
	return m.Action == "" && m.Actions == nil && m.ResourceType == "" && m.ResourceID == "" && m.SubjectType == ""
}
