package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/conformance/sep2848"
)

// TestExitStatus: a run that skipped checks nobody allowed does not exit 0;
// a failure outranks a skip; allowing by check id or by scenario works.
func TestExitStatus(t *testing.T) {
	results := []sep2848.Result{
		{ID: "sep-2848-approval-executes", Scenario: "approve", Outcome: sep2848.Passed},
		{ID: "sep-2848-expired-denied", Scenario: "expiry", Outcome: sep2848.Skipped},
		{ID: "sep-2848-outcome-unknown-disposition", Scenario: "outcome-unknown", Outcome: sep2848.Skipped},
	}
	unallowed := unallowedSkips(results, nil)
	require.Equal(t, []string{"sep-2848-expired-denied", "sep-2848-outcome-unknown-disposition"}, unallowed)
	require.Equal(t, 3, exitCode(0, unallowed))
	require.Equal(t, 1, exitCode(1, unallowed), "a failure outranks a skip")
	require.Equal(t, []string{"sep-2848-outcome-unknown-disposition"}, unallowedSkips(results, []string{"sep-2848-expired-denied"}))
	require.Empty(t, unallowedSkips(results, []string{"expiry", "outcome-unknown"}))
	require.Equal(t, 0, exitCode(0, nil))
}
