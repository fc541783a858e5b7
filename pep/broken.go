//go:build arapbroken

package pep

import (
	"fmt"
	"os"
	"slices"
)

// This file makes the deliberately broken build; only `go build -tags
// arapbroken` compiles it. ARAP_BROKEN names the one violation the process
// commits (none when unset); an unknown name stops it at start, so a typo
// in a test cannot pass for a caught violation.
const brokenBuild = true

var brokenAs = func() violation {
	v := violation(os.Getenv("ARAP_BROKEN"))
	known := []violation{violateExecuteOnRequestableDenial, violateExecuteAfterDenial, violateExecuteAfterCancel,
		violateExecuteAfterExpiry, violateSecondExecution, violateDispositionDisagrees, violateArtifactLeak,
		violateOtherPrincipalsTask, violateDedupOff, violateLimitsOff, violateEnvelopeOnExecuted, violateRetryAsDenial,
		violateChainUnbounded, violatePendingShownDone, violateNeedsToolApproval, violateNoRetention,
		violatePlainClientsGetTasks, violateMRTRUnbound, violateTerminalReopened, violateExpiryUnexplained,
		violateExecutionErrorSaysNotRun, violateExecutionErrorAsSuccess, violateClockTaskIDs, violateArgumentsTruncated,
		violateBodySilentOnRun, violateNoDisposition, violateDenialWithoutEnvelope, violateDenialSilentOnRun,
		violateBackendCancelIgnored, violatePendingWithoutEnvelope, violateStatusRepeatsArguments,
		violateAuthorizationContextID, violateToolApprovalUndeclared, violateRetryPastExpiry, violateInputWithoutEnvelope,
		violateDedupAcrossPrincipals, violatePlainDenialAsError, violateCancelIgnored}
	if v != "" && !slices.Contains(known, v) {
		panic(fmt.Sprintf("ARAP_BROKEN=%q: no such violation; the violations are %v", v, known))
	}
	return v
}()
