package sep2848

// Wire names, as the drafts spell them today. They are repeated here rather
// than imported from the server's packages on purpose: a conformance suite
// that shared the implementation's constants would keep passing after a
// rename on both sides.
const (
	ProtocolVersion = "2026-07-28"

	ExtTasks        = "io.modelcontextprotocol/tasks"
	ExtToolApproval = "io.modelcontextprotocol/tool-approval"

	MetaProtocolVersion    = "io.modelcontextprotocol/protocolVersion"
	MetaClientCapabilities = "io.modelcontextprotocol/clientCapabilities"
	MetaClientInfo         = "io.modelcontextprotocol/clientInfo"
	MetaAuthorization      = "io.modelcontextprotocol/authorization" // SEP-2643 envelope
	MetaDisposition        = "io.modelcontextprotocol/tool-approval-disposition"
	MetaImmediate          = "io.modelcontextprotocol/model-immediate-response"

	HeaderProtocolVersion = "Mcp-Protocol-Version"
	HeaderMethod          = "Mcp-Method"
	HeaderName            = "Mcp-Name"

	MethodCall     = "tools/call"
	MethodGet      = "tasks/get"
	MethodUpdate   = "tasks/update"
	MethodCancel   = "tasks/cancel"
	MethodDiscover = "server/discover"

	ResultTask          = "task"
	ResultComplete      = "complete"
	ResultInputRequired = "input_required"

	StatusWorking       = "working"
	StatusInputRequired = "input_required"
	StatusCompleted     = "completed"
	StatusFailed        = "failed"
	StatusCancelled     = "cancelled"

	ApprovedExecuted  = "approved-executed"
	DeniedNotExecuted = "denied-not-executed"
	ExecutionError    = "execution-error"
	OutcomeUnknown    = "outcome-unknown"

	ReasonInsufficientAuthorization = "insufficient_authorization"
	RemediationAvailable            = "available"
	RemediationUnavailable          = "unavailable"
)

// Missing Required Client Capability: the seed names -32003; the
// 2026-07-28 allocation moved it to -32021. Either is accepted when the
// error names the tasks extension.
var codesMissingCapability = []int{-32003, -32021}

// codeMethodNotFound is JSON-RPC's "Method not found".
const codeMethodNotFound = -32601

// backendArtifacts are member names of the backend's binding material and
// endpoints (ARAP's, and generic ones) that must never reach the client.
var backendArtifacts = []string{
	"binding_token", "evaluation_id", "access_request", "approval", "approval_state",
	"status_endpoint", "request_schema_url", "form_url", "request_catalogs_url",
	"denial", "approved_until", "binding_hash", "idempotency_key",
}
