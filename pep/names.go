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

// What the PDP is asked about a request passed through from an upstream
// besides tools/call: the action is the MCP method; the resource's type says
// what it names (its id: a resource's URI, a prompt's exposed name).
const (
	ActionReadResource = "resources/read"
	ActionGetPrompt    = "prompts/get"
	ActionComplete     = "completion/complete"

	ResourceTypeResource = "mcp_resource"
	ResourceTypePrompt   = "mcp_prompt"
)
