package mcp

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
	violateEnvelopeOnSuccess          violation = "envelope-on-success"
	violateRetryAsDenial              violation = "retry-as-denial"
	violateChainUnbounded             violation = "chain-unbounded"
	violatePendingShownDone           violation = "pending-shown-done"
	violateNeedsToolApproval          violation = "needs-tool-approval"
)

// broken reports whether this build commits violation v.
func broken(v violation) bool { return brokenAs == v }
