package evaluation

import (
	"slices"
	"strings"

	"github.com/google/cel-go/cel"
	celast "github.com/google/cel-go/common/ast"
)

// Definition is a named CEL expression from the policy's definitions:
// section. Conditions (rule and resolver when:, and other definitions) read
// it as a variable of that name. It is evaluated at most once per
// evaluation, and only when a condition reads it.
type Definition struct {
	Name    string
	Expr    Expr
	program cel.Program
}

// Names of the variables conditions read; a definition may not reuse them.
const (
	varSubject           = "subject"
	varResource          = "resource"
	varAction            = "action"
	varContext           = "context"
	varNow               = "now"
	varAttributes        = "attributes"
	varWindows           = "windows"
	varSubjectAttributes = "subject_attributes"
)

var reservedNames = []string{varSubject, varResource, varAction, varContext, varNow, varAttributes, varWindows,
	varSubjectAttributes, "true", "false", "null", "in", "as", "break", "const", "continue", "else", "for",
	"function", "if", "import", "let", "loop", "package", "namespace", "return", "var", "void", "while"}

// maxDefinitions bounds the definitions of one policy.
const maxDefinitions = 256

// compileDefinitions compiles the definitions in an order where each comes
// after those it reads, and returns env extended with a variable per
// definition. A definition that reads itself, directly or through others,
// is an error naming the cycle.
func compileDefinitions(env *cel.Env, specs map[string]Expr, add func(line int, format string, args ...any)) (*cel.Env, map[string]*Definition) {
	defs := map[string]*Definition{}
	if len(specs) == 0 {
		return env, defs
	}
	names := make([]string, 0, len(specs))
	for n := range specs {
		names = append(names, n)
	}
	slices.Sort(names)
	if len(names) > maxDefinitions {
		add(specs[names[0]].Line, "at most %d definitions, got %d", maxDefinitions, len(names))
		return env, defs
	}
	// Which definitions each one reads, from its parsed (unchecked) form.
	reads := map[string][]string{}
	ok := map[string]bool{}
	for _, n := range names {
		e := specs[n]
		switch {
		case !nameRE.MatchString(n):
			add(e.Line, "definition %q: name must be lower_snake_case (a-z, 0-9, _), at most 63 characters", n)
			continue
		case slices.Contains(reservedNames, n):
			add(e.Line, "definition %q: the name is taken by a built-in variable or CEL keyword; choose another", n)
			continue
		case strings.TrimSpace(e.Src) == "":
			add(e.Line, "definition %q: is empty; give a CEL expression", n)
			continue
		}
		parsed, iss := env.Parse(e.Src)
		if iss != nil && iss.Err() != nil {
			add(e.Line, "definition %q: %s", n, oneLine(iss.Err().Error()))
			continue
		}
		ok[n] = true
		seen := map[string]bool{}
		celast.PostOrderVisit(parsed.NativeRep().Expr(), celast.NewExprVisitor(func(x celast.Expr) {
			if x.Kind() == celast.IdentKind {
				if id := x.AsIdent(); !seen[id] {
					if _, isDef := specs[id]; isDef {
						seen[id] = true
						reads[n] = append(reads[n], id)
					}
				}
			}
		}))
		slices.Sort(reads[n])
	}
	// Depth-first topological order; a back edge is a cycle.
	const (
		unvisited = iota
		visiting
		done
	)
	state := map[string]int{}
	var order []string
	var path []string
	var visit func(n string) bool
	visit = func(n string) bool {
		switch state[n] {
		case done:
			return true
		case visiting:
			i := slices.Index(path, n)
			add(specs[n].Line, "definition %q: definitions read each other in a cycle (%s -> %s)", n, strings.Join(path[i:], " -> "), n)
			return false
		}
		state[n] = visiting
		path = append(path, n)
		good := true
		for _, m := range reads[n] {
			if !visit(m) {
				good = false
				break
			}
		}
		path = path[:len(path)-1]
		state[n] = done
		if good {
			order = append(order, n)
		}
		return good
	}
	for _, n := range names {
		if ok[n] && state[n] == unvisited {
			visit(n)
		}
	}
	for _, n := range order {
		if !ok[n] || slices.ContainsFunc(reads[n], func(m string) bool { return defs[m] == nil }) {
			continue // a definition it reads failed; that one was reported
		}
		e := specs[n]
		checked, iss := env.Compile(e.Src)
		if iss != nil && iss.Err() != nil {
			add(e.Line, "definition %q: %s", n, oneLine(iss.Err().Error()))
			continue
		}
		prg, err := env.Program(checked, cel.CostLimit(celCostLimit), cel.EvalOptions(cel.OptOptimize))
		if err != nil {
			add(e.Line, "definition %q: %v", n, err)
			continue
		}
		next, err := env.Extend(cel.Variable(n, checked.OutputType()))
		if err != nil {
			add(e.Line, "definition %q: %v", n, err)
			continue
		}
		env = next
		defs[n] = &Definition{Name: n, Expr: e, program: prg}
	}
	return env, defs
}

// celVars lists the variable declarations every condition may read.
func celVars(subjectAttributes bool) []cel.EnvOption {
	out := []cel.EnvOption{
		cel.Variable(varSubject, cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable(varResource, cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable(varAction, cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable(varContext, cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable(varNow, cel.TimestampType),
		cel.Variable(varAttributes, cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable(varWindows, cel.MapType(cel.StringType, cel.BoolType)),
	}
	if subjectAttributes {
		// Declared only when the policy names a source, so a condition that
		// reads it without one is a load error, not a silent empty map.
		out = append(out, cel.Variable(varSubjectAttributes, cel.MapType(cel.StringType, cel.DynType)))
	}
	return out
}
