package dev_test

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/pep"
)

// TestPolicyCases (issue 38): the dev policy decides each of its cases
// (policy-cases.yaml) as expected, and reads no property path the demo
// tools' calls do not have: `arapctl policy test` and `policy check` as CI
// runs them.
func TestPolicyCases(t *testing.T) {
	p, err := evaluation.LoadFile("policy.yaml")
	require.NoError(t, err)
	raw, err := os.ReadFile("policy-cases.yaml")
	require.NoError(t, err)
	cases, err := evaluation.ParseCases("policy-cases.yaml", raw)
	require.NoError(t, err)
	outcomes, err := evaluation.RunCases(context.Background(), p, cases)
	require.NoError(t, err)
	for _, o := range outcomes {
		require.Empty(t, o.Diffs, "case %q (line %d)", o.Case.Name, o.Case.Line)
	}
	tools := map[string]map[string]any{}
	for _, tl := range pep.DemoTools() {
		tools[tl.Name] = tl.InputSchema
	}
	for _, f := range evaluation.Check(p, evaluation.CheckEnv{Tools: tools, Groups: map[string]bool{"treasury": true, "platform": true}}) {
		require.True(t, f.Note, "policy.yaml:%d: %s", f.Line, f.Message)
	}
}
