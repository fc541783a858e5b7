//go:build arapbroken

package mcp

// This file makes a deliberately broken build for the SEP-2848 conformance
// suite's own test (e2e.TestSEP2848CatchesBrokenBuild): it executes the
// tool on a requestable denial, the first thing the extension forbids. Only
// `go build -tags arapbroken` compiles it.
const brokenExecutesOnRequestableDenial = true
