package evaluation

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/google/cel-go/cel"
	celast "github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/types"
)

// What Parse does not find in a policy, Check does, offline (no database,
// no key): every property path a condition reads is one the evaluation
// request has, a tool's arguments typed by the tool's input schema for a
// rule that names it, so a typo (resource.properties.arguments.amout) is
// reported now instead of silently never matching at run time; the groups
// and users approvals name exist in the directory given; no two rules share
// a template. `arapctl policy check` runs it.

// CheckEnv is what a policy is checked against.
type CheckEnv struct {
	// Tools are the tools calls are for, by exposed name: their input
	// schemas type resource.properties.arguments of a rule naming one.
	Tools map[string]map[string]any
	// Groups and Users are the directory's; nil: not checked.
	Groups, Users map[string]bool
}

// Finding is one thing Check found, at a line of the policy.
type Finding struct {
	Line    int
	Message string
	// Note marks what may be right (a tool the environment does not
	// offer); the rest are errors.
	Note bool
}

// Check reports what p's conditions read that no evaluation request has,
// and names the directory does not know. Paths listed in p.Expects, and
// below them, are accepted.
func Check(p *Policy, env CheckEnv) []Finding {
	var out []Finding
	parser, err := cel.NewEnv(cel.OptionalTypes(), cel.CrossTypeNumericComparisons(true))
	if err != nil {
		return []Finding{{Message: err.Error()}}
	}
	paths := func(line int, what, src string, args *shape) {
		if src == "" {
			return
		}
		ast, iss := parser.Parse(src)
		if iss != nil && iss.Err() != nil {
			return // Parse reported it
		}
		for _, f := range checkPaths(ast.NativeRep().Expr(), requestShape(p, args)) {
			if !expected(p.Expects, f.path) {
				out = append(out, Finding{Line: line, Message: what + ": " + f.message})
			}
		}
	}
	for name, d := range p.Definitions {
		paths(d.Expr.Line, fmt.Sprintf("definition %q", name), d.Expr.Src, open())
	}
	templates := map[string]string{}
	for _, r := range p.Rules {
		what := fmt.Sprintf("rule %q", r.Name)
		args := open()
		if tool := r.Match.ResourceID; tool != "" && env.Tools != nil {
			if schema, ok := env.Tools[tool]; ok {
				args = fromSchema(tool+"'s input schema", schema)
			} else {
				out = append(out, Finding{Line: r.Line, Note: true, Message: fmt.Sprintf("%s: names tool %q, which none of the tools checked against offers; its arguments are not checked", what, tool)})
			}
		}
		paths(r.When.Line, what+" when", r.When.Src, args)
		for _, res := range r.Resolvers {
			paths(res.When.Line, fmt.Sprintf("%s resolver %q", what, res.Name), res.When.Src, args)
		}
		if r.Effect != EffectRequest {
			continue
		}
		if other, dup := templates[r.Template]; dup {
			out = append(out, Finding{Line: r.Line, Message: fmt.Sprintf("%s: template %q is also rule %q's: a submission could not say which rule it is for", what, r.Template, other)})
		}
		templates[r.Template] = r.Name
		for _, g := range append(slices.Clone(r.Approval.Groups), nonEmpty(r.Approval.EscalateTo)...) {
			if env.Groups != nil && !env.Groups[g] {
				out = append(out, Finding{Line: r.Line, Message: fmt.Sprintf("%s: group %q is not in the directory: nobody could decide through it", what, g)})
			}
		}
		for _, u := range r.Approval.Users {
			if env.Users != nil && !env.Users[u] {
				out = append(out, Finding{Line: r.Line, Message: fmt.Sprintf("%s: user %q is not in the directory", what, u)})
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Line < out[j].Line })
	return out
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

// expected reports whether path is one of the policy's declared paths, or
// below one.
func expected(expects []string, path string) bool {
	for _, e := range expects {
		if path == e || strings.HasPrefix(path, e+".") {
			return true
		}
	}
	return false
}

// shape is what a path may continue with: known members (each a shape),
// or anything (open).
type shape struct {
	what    string // what defines it, for messages
	members map[string]*shape
	leaf    bool // a value, with no members
}

func open() *shape { return &shape{} }

func leaf(what string) *shape { return &shape{what: what, leaf: true} }

func obj(what string, members map[string]*shape) *shape { return &shape{what: what, members: members} }

// requestShape is what conditions may read: the evaluation request as a
// PEP sends it (package pep builds it), with a rule's arguments shape, the
// policy's windows and definitions.
func requestShape(p *Policy, args *shape) *shape {
	windows := map[string]*shape{}
	for name := range p.Windows {
		windows[name] = leaf("window")
	}
	hints := map[string]*shape{}
	for _, h := range []string{"readOnlyHint", "idempotentHint", "destructiveHint", "openWorldHint"} {
		hints[h] = leaf("annotation")
	}
	top := map[string]*shape{
		varSubject: obj("the subject", map[string]*shape{"type": leaf("subject.type"), "id": leaf("subject.id"), "properties": open()}),
		varResource: obj("the resource", map[string]*shape{"type": leaf("resource.type"), "id": leaf("resource.id"),
			"properties": obj("the resource's properties", map[string]*shape{"arguments": args, "upstream": leaf("upstream"),
				"upstream_tool": leaf("upstream_tool"), "annotations": obj("the tool's annotations", hints)})}),
		varAction:            obj("the action", map[string]*shape{"name": leaf("action.name"), "properties": open()}),
		varContext:           open(),
		varAttributes:        open(),
		varSubjectAttributes: open(),
		varNow:               leaf("now"),
		varWindows:           obj("the policy's windows", windows),
	}
	for name := range p.Definitions {
		top[name] = open()
	}
	return obj("", top)
}

// fromSchema is the shape of values a JSON schema describes: an object's
// declared properties; anything else open (an array's items, a schema
// without properties).
func fromSchema(what string, schema map[string]any) *shape {
	props, ok := schema["properties"].(map[string]any)
	if !ok {
		if t, _ := schema["type"].(string); t != "" && t != "object" {
			return leaf(what)
		}
		return open()
	}
	members := map[string]*shape{}
	for name, sub := range props {
		s, _ := sub.(map[string]any)
		members[name] = fromSchema(what, s)
	}
	return obj(what, members)
}

type pathFinding struct{ path, message string }

// checkPaths walks e and checks each property path it reads (a chain of
// selections and constant indexes from a variable) against top.
func checkPaths(e celast.Expr, top *shape) []pathFinding {
	var out []pathFinding
	seen := map[string]bool{}
	var walk func(e celast.Expr, bound map[string]bool)
	walk = func(e celast.Expr, bound map[string]bool) {
		if parts, ok := pathOf(e); ok && len(parts) > 1 && !bound[parts[0]] {
			path := strings.Join(parts, ".")
			if !seen[path] {
				seen[path] = true
				if msg := follow(top, parts); msg != "" {
					out = append(out, pathFinding{path: path, message: path + ": " + msg})
				}
			}
			return
		}
		switch e.Kind() {
		case celast.SelectKind:
			walk(e.AsSelect().Operand(), bound)
		case celast.CallKind:
			c := e.AsCall()
			if c.IsMemberFunction() {
				walk(c.Target(), bound)
			}
			for _, a := range c.Args() {
				walk(a, bound)
			}
		case celast.ListKind:
			for _, el := range e.AsList().Elements() {
				walk(el, bound)
			}
		case celast.MapKind:
			for _, en := range e.AsMap().Entries() {
				walk(en.AsMapEntry().Key(), bound)
				walk(en.AsMapEntry().Value(), bound)
			}
		case celast.ComprehensionKind:
			c := e.AsComprehension()
			walk(c.IterRange(), bound)
			inner := map[string]bool{c.IterVar(): true, c.AccuVar(): true}
			if c.HasIterVar2() {
				inner[c.IterVar2()] = true
			}
			for k := range bound {
				inner[k] = true
			}
			for _, x := range []celast.Expr{c.AccuInit(), c.LoopCondition(), c.LoopStep(), c.Result()} {
				walk(x, inner)
			}
		}
	}
	walk(e, map[string]bool{})
	return out
}

// pathOf is the property path e reads: a variable, then member selections
// (has() tests too) and indexes by constant strings.
func pathOf(e celast.Expr) ([]string, bool) {
	switch e.Kind() {
	case celast.IdentKind:
		return []string{e.AsIdent()}, true
	case celast.SelectKind:
		s := e.AsSelect()
		parts, ok := pathOf(s.Operand())
		return append(parts, s.FieldName()), ok
	case celast.CallKind:
		c := e.AsCall()
		if (c.FunctionName() == "_[_]" || c.FunctionName() == "_[?_]") && len(c.Args()) == 2 && c.Args()[1].Kind() == celast.LiteralKind {
			if s, ok := c.Args()[1].AsLiteral().(types.String); ok {
				parts, ok := pathOf(c.Args()[0])
				return append(parts, string(s)), ok
			}
		}
	}
	return nil, false
}

// follow checks parts against s, saying what is wrong ("" when nothing is).
func follow(s *shape, parts []string) string {
	for i, name := range parts {
		if s.members == nil && !s.leaf {
			return "" // open from here on
		}
		if s.leaf {
			return fmt.Sprintf("%s is a value, with no member %q", strings.Join(parts[:i], "."), name)
		}
		next, ok := s.members[name]
		if !ok {
			known := make([]string, 0, len(s.members))
			for k := range s.members {
				known = append(known, k)
			}
			sort.Strings(known)
			where := s.what
			if i == 0 {
				return fmt.Sprintf("%q is not a variable conditions can read (they can: %s)", name, strings.Join(known, ", "))
			}
			return fmt.Sprintf("%s has no %q (it has: %s); a typo? If the PEP sends it, list the path under expects:", where, name, strings.Join(known, ", "))
		}
		s = next
	}
	return ""
}
