package pep

import "fmt"

// The deliberately broken build (go build -tags arapbroken) commits one
// violation of SEP-2848, chosen at run time by ARAP_BROKEN, so the
// conformance suite's own test (e2e.TestSEP2848CatchesBrokenBuild) can show
// each family of its checks failing. Every switch reads
// `if brokenBuild && broken(v)`: in every other build brokenBuild is a false
// constant, so the branch is dropped at compile time, and neither it, the
// names below nor the variable's name is in the binary (the e2e test
// checks).
type violation string

const (
	violateExecuteOnRequestableDenial violation = "execute-on-requestable-denial"
	violateExecuteAfterDenial         violation = "execute-after-denial"
	violateExecuteAfterCancel         violation = "execute-after-cancel"
	violateExecuteAfterExpiry         violation = "execute-after-expiry"
	violateSecondExecution            violation = "second-execution"
	violateDispositionDisagrees       violation = "disposition-disagrees"
	violateArtifactLeak               violation = "artifact-leak"
	violateOtherPrincipalsTask        violation = "other-principals-task"
	violateDedupOff                   violation = "dedup-off"
	violateLimitsOff                  violation = "limits-off"
	violateEnvelopeOnExecuted         violation = "envelope-on-executed"
	violateRetryAsDenial              violation = "retry-as-denial"
	violateChainUnbounded             violation = "chain-unbounded"
	violatePendingShownDone           violation = "pending-shown-done"
	violateNeedsToolApproval          violation = "needs-tool-approval"
	violateNoRetention                violation = "no-retention"
	violatePlainClientsGetTasks       violation = "plain-clients-get-tasks"
	violateMRTRUnbound                violation = "mrtr-unbound"
	violateTerminalReopened           violation = "terminal-reopened"
	violateExpiryUnexplained          violation = "expiry-unexplained"
	violateExecutionErrorSaysNotRun   violation = "execution-error-says-not-run"
	violateExecutionErrorAsSuccess    violation = "execution-error-as-success"
	violateClockTaskIDs               violation = "clock-task-ids"
	violateArgumentsTruncated         violation = "arguments-truncated"
	violateBodySilentOnRun            violation = "body-silent-on-run"
	violateNoDisposition              violation = "no-disposition"
	violateDenialWithoutEnvelope      violation = "denial-without-envelope"
	violateDenialSilentOnRun          violation = "denial-silent-on-run"
	violateBackendCancelIgnored       violation = "backend-cancel-ignored"
	violatePendingWithoutEnvelope     violation = "pending-without-envelope"
	violateStatusRepeatsArguments     violation = "status-repeats-arguments"
	violateAuthorizationContextID     violation = "authorization-context-id"
	violateToolApprovalUndeclared     violation = "tool-approval-undeclared"
	violateRetryPastExpiry            violation = "retry-past-expiry"
	violateInputWithoutEnvelope       violation = "input-without-envelope"
	violateDedupAcrossPrincipals      violation = "dedup-across-principals"
	violatePlainDenialAsError         violation = "plain-denial-as-error"
	violateCancelIgnored              violation = "cancel-ignored"
)

// broken reports whether this build commits violation v.
func broken(v violation) bool { return brokenAs == v }

// brokenStatusArgs is what the status-repeats-arguments violation adds to
// a pending task's statusMessage: the client's own argument text.
func brokenStatusArgs(args map[string]any) string {
	if brokenBuild && broken(violateStatusRepeatsArguments) {
		return fmt.Sprintf(" (to %v)", args["to"])
	}
	return ""
}

// brokenInputMeta is an in-task input request's _meta, without its
// envelope under the input-without-envelope violation.
func brokenInputMeta(meta map[string]any) map[string]any {
	if brokenBuild && broken(violateInputWithoutEnvelope) {
		return nil
	}
	return meta
}
