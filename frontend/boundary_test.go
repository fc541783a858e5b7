package frontend_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/omcp/arap/"

// frontEnd are the packages of `arapd mcp`: this assembly, the PEP and the
// MCP extensions it serves (tasks, the conformance fixtures), and its
// connections to upstream MCP servers.
var frontEnd = []string{"frontend", "pep/...", "mcp/...", "upstream", "agentauth"}

// backendDomain are the backend's packages: its state, its rules and its
// HTTP surface. The front-end reaches them over HTTP only, as any PEP would.
var backendDomain = []string{
	"arap", "attributes", "audit", "backend", "callbacks", "clients", "directory", "evaluation", "requests", "signing", "webui",
}

// shared are the module's packages both sides may link: leaves that hold no
// backend state or logic and import no backend package.
var shared = []string{
	"arapclient", "authzen", "identity", "migrations", "webhook",
	"internal/chain", "internal/clean", "internal/clientip", "internal/dbdown", "internal/durability", "internal/fault", "internal/host", "internal/logs", "internal/pglisten", "internal/ratelimit",
	"internal/schemamsg", "internal/seal", "internal/telemetry", "internal/version", "internal/visible", "internal/yamlfile",
}

// TestFrontEndLinksNoBackendPackage: what the front-end's packages link
// (go list -deps, test files aside) includes no backend domain package, and
// every other package of this module it links is a shared leaf. A new
// dependency must be one of those, decided here rather than by accident.
func TestFrontEndLinksNoBackendPackage(t *testing.T) {
	t.Parallel()
	pkgs := listDeps(t, frontEnd)
	for _, p := range frontEnd {
		require.True(t, slices.ContainsFunc(pkgs, func(q pkg) bool { return !q.DepOnly && within(q.ImportPath, p) }),
			"no front-end package matches %s: update frontEnd after a rename", p)
	}
	imports := map[string][]string{}
	var roots []string
	for _, p := range pkgs {
		imports[p.ImportPath] = p.Imports
		if !p.DepOnly {
			roots = append(roots, p.ImportPath)
		}
	}
	var problems []string
	for _, p := range pkgs {
		rel, ok := strings.CutPrefix(p.ImportPath, module)
		if !ok || p.Standard || slices.ContainsFunc(frontEnd, func(f string) bool { return within(p.ImportPath, f) }) {
			continue
		}
		switch {
		case slices.Contains(backendDomain, rel):
			problems = append(problems, "links backend package "+rel+": "+path(roots, imports, p.ImportPath))
		case !slices.Contains(shared, rel):
			problems = append(problems, "links "+rel+", which is neither a front-end package nor a shared leaf (add it to shared if it imports no backend package): "+path(roots, imports, p.ImportPath))
		}
	}
	for _, p := range problems {
		t.Errorf("the front-end must reach the backend over HTTP only, but it %s", p)
	}
}

type pkg struct {
	ImportPath string
	Imports    []string
	DepOnly    bool
	Standard   bool
}

// listDeps runs go list -deps on the given module-relative patterns.
func listDeps(t *testing.T, patterns []string) []pkg {
	t.Helper()
	args := []string{"list", "-deps", "-json=ImportPath,Imports,DepOnly,Standard"}
	for _, p := range patterns {
		args = append(args, module+p)
	}
	var stderr bytes.Buffer
	cmd := exec.Command("go", args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go list: %s", stderr.String())
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else {
			require.NoError(t, err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// within reports whether import path p matches the module-relative pattern
// (a path, or a path ending in /... for it and everything below).
func within(p, pattern string) bool {
	base, tree := strings.CutSuffix(pattern, "/...")
	return p == module+base || (tree && strings.HasPrefix(p, module+base+"/"))
}

// path shows one import chain from a front-end package to target.
func path(roots []string, imports map[string][]string, target string) string {
	from := map[string]string{}
	queue := slices.Clone(roots)
	for _, r := range roots {
		from[r] = ""
	}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == target {
			chain := []string{}
			for ; p != ""; p = from[p] {
				chain = append(chain, strings.TrimPrefix(p, module))
			}
			slices.Reverse(chain)
			return strings.Join(chain, " -> ")
		}
		for _, q := range imports[p] {
			if _, seen := from[q]; !seen {
				from[q] = p
				queue = append(queue, q)
			}
		}
	}
	return target
}
