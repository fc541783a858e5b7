// Package pep is the policy enforcement point: an MCP server (official Go
// SDK, protocol 2026-07-28, stateless) whose every tools/call is decided by
// the AuthZEN PDP. A requestable denial becomes a durable MCP task (the
// tasks extension, package tasks) bound to an ARAP access request; when the
// request is approved, the call is re-evaluated with the approval and, if
// allowed, executed exactly once behind an atomic claim. This is SEP-2848,
// io.modelcontextprotocol/tool-approval.
//
// The journey of one wire_transfer: Server.callTool (gate.go) evaluates,
// writes the intent, submits, binds the handle and returns CreateTaskResult;
// the backend's callback or the polling job calls Gate.Advance (approval.go),
// which reads the status endpoint, re-evaluates and calls execute; tasks/get
// reads the stored result. The claim and every way a task ends are recorded,
// in the same transaction, in the front-end's own hash-chained audit trail
// (audit.go), which VerifyAudit (arapctl audit verify --pep) checks.
package pep

// Wire names of the extensions this package speaks (drafts: they may move).
const (
	ExtensionToolApproval = "io.modelcontextprotocol/tool-approval"

	// MetaAuthorization is SEP-2643's denial envelope key.
	MetaAuthorization = "io.modelcontextprotocol/authorization"
	// MetaDisposition says what happened to the tool (SEP-2848).
	MetaDisposition = "io.modelcontextprotocol/tool-approval-disposition"
	// MetaImmediate is an immediate string for the model.
	MetaImmediate = "io.modelcontextprotocol/model-immediate-response"
)

// Dispositions.
const (
	ApprovedExecuted  = "approved-executed"
	DeniedNotExecuted = "denied-not-executed"
	ExecutionError    = "execution-error"
	OutcomeUnknown    = "outcome-unknown"
)

// SEP-2643 envelope values.
const (
	ReasonInsufficientAuthorization = "insufficient_authorization"
	RemediationAvailable            = "available"
	RemediationUnavailable          = "unavailable"
	RemediationUndisclosed          = "undisclosed"
)

// Envelope is the SEP-2643 denial envelope.
type Envelope struct {
	Reason           string           `json:"reason"`
	Remediation      string           `json:"remediation"`
	RemediationHints []map[string]any `json:"remediationHints,omitempty"`
}

// envelope returns the envelope for a remediation, with a task hint when the
// remediation is an out-of-band decision.
func envelope(remediation string, taskHint bool) Envelope {
	e := Envelope{Reason: ReasonInsufficientAuthorization, Remediation: remediation}
	if taskHint {
		e.RemediationHints = []map[string]any{{"type": "task"}}
	}
	return e
}
