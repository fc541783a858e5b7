// Package tasks implements the MCP tasks extension (SEP-2663,
// io.modelcontextprotocol/tasks) on top of the official Go SDK: the durable
// task store, tasks/get, tasks/update and tasks/cancel as custom methods,
// notifications/tasks over subscriptions/listen, and an HTTP wrapper for what
// the SDK does not check (Mcp-Name = taskId). It knows nothing about
// approvals: a task kind (the approval gate, a conformance fixture) plugs in
// through the Kind interface.
package tasks

// Wire names.
const (
	ExtensionID = "io.modelcontextprotocol/tasks"

	MethodGet    = "tasks/get"
	MethodUpdate = "tasks/update"
	MethodCancel = "tasks/cancel"
	MethodListen = "subscriptions/listen"

	NotificationTasks        = "notifications/tasks"
	NotificationAcknowledged = "notifications/subscriptions/acknowledged"

	ResultTypeTask          = "task"
	ResultTypeComplete      = "complete"
	ResultTypeInputRequired = "input_required" // MRTR (SEP-2322)

	MetaProtocolVersion    = "io.modelcontextprotocol/protocolVersion"
	MetaClientCapabilities = "io.modelcontextprotocol/clientCapabilities"
	MetaSubscriptionID     = "io.modelcontextprotocol/subscriptionId"
	MetaServerInfo         = "io.modelcontextprotocol/serverInfo"

	HeaderProtocolVersion = "Mcp-Protocol-Version"
	HeaderMethod          = "Mcp-Method"
	HeaderName            = "Mcp-Name"
	// HeaderParamPrefix and HeaderAnnotation: a tool parameter annotated
	// with x-mcp-header is mirrored into Mcp-Param-{name} (SEP-2243).
	HeaderParamPrefix = "Mcp-Param-"
	HeaderAnnotation  = "x-mcp-header"
	MetaClientInfo    = "io.modelcontextprotocol/clientInfo"

	ProtocolVersion = "2026-07-28"
)

// JSON-RPC error codes (2026-07-28 allocation).
const (
	CodeParseError                  = -32700
	CodeInvalidRequest              = -32600
	CodeInvalidParams               = -32602
	CodeInternalError               = -32603
	CodeHeaderMismatch              = -32020
	CodeMissingRequiredCapabilities = -32021
	// CodeUnsupportedProtocolVersion: data.supported lists the versions
	// the server speaks.
	CodeUnsupportedProtocolVersion = -32022
	// CodeTooManyStreams refuses a listen stream over the per-principal
	// cap: an application code, outside the JSON-RPC reserved range as
	// the 2026-07-28 revision asks of codes it does not define.
	CodeTooManyStreams = -31000
	// CodeUnavailable: the request failed because the database (or the
	// backend behind the front-end) is unavailable; nothing changed, and
	// the same request may be sent again after data.retryAfterSeconds.
	// Not -32603: that says "a bug", this says "retry". An application
	// code, like CodeTooManyStreams.
	CodeUnavailable = -31001
)

// Change notifications a listen stream may carry besides notifications/tasks
// (2026-07-28, SEP-2575), and the opt-ins that ask for them: the members of
// params.notifications beside taskIds.
const (
	NotificationToolsListChanged     = "notifications/tools/list_changed"
	NotificationPromptsListChanged   = "notifications/prompts/list_changed"
	NotificationResourcesListChanged = "notifications/resources/list_changed"
	NotificationResourceUpdated      = "notifications/resources/updated"

	OptToolsListChanged      = "toolsListChanged"
	OptPromptsListChanged    = "promptsListChanged"
	OptResourcesListChanged  = "resourcesListChanged"
	OptResourceSubscriptions = "resourceSubscriptions"
	OptTaskIDs               = "taskIds"
)
