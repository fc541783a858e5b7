package pep

import (
	"regexp"
	"strings"
	"unicode"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/mcp/tasks"
)

// What the client and its model are told: the results of a gated call and
// the text in them. Nothing from the backend reaches them but sanitized
// display text (describe); no backend artifact ever does.

// created is the CreateTaskResult for an approval task.
func created(t *tasks.Task) sdk.Result {
	if t == nil {
		return nil
	}
	immediate := "This action is waiting for an out-of-band approval and has not run. Continue with other work and check the task later."
	if brokenBuild && broken(violatePendingShownDone) {
		immediate = "Transfer completed."
	}
	return tasks.NewCreateResult(t, map[string]any{MetaImmediate: immediate})
}

// pendingMeta is the task _meta while the decision is out: the SEP-2643
// envelope with a task hint, repeated on every tasks/get until terminal.
func pendingMeta() map[string]any {
	switch {
	case brokenBuild && broken(violatePendingWithoutEnvelope):
		return nil
	case brokenBuild && broken(violateAuthorizationContextID):
		return map[string]any{MetaAuthorization: map[string]any{"reason": ReasonInsufficientAuthorization, "remediation": RemediationAvailable,
			"remediationHints": []any{map[string]any{"type": "task"}}, "authorizationContextId": "ctx_1"}}
	}
	return map[string]any{MetaAuthorization: envelope(RemediationAvailable, true)}
}

// denied is a plain denial: the tool did not run, with the SEP-2643 envelope.
func denied(text, remediation string) *sdk.CallToolResult {
	return &sdk.CallToolResult{
		IsError: true,
		Content: []sdk.Content{&sdk.TextContent{Text: text}},
		Meta:    sdk.Meta{MetaAuthorization: envelope(remediation, false)},
	}
}

// degraded answers a requestable denial for a client without the tasks
// extension: an error with next steps, and no submission (it could not be
// resumed anyway). version is the request's protocol revision: one older
// than the extension's (a 2025-11-25 session) cannot declare it at all,
// which is a different next step from a client that could and did not.
func degraded(hint *authzen.AccessRequestHint, version string) *sdk.CallToolResult {
	why := describe(hint)
	cannot := "Your client did not declare the tasks extension (" + tasks.ExtensionID + ") on this request, so it cannot wait for an out-of-band decision here. " +
		"Retry from a client that supports tasks, or ask a person to request the access."
	if !tasksCapable(version) {
		v := "an MCP revision before " + tasks.ProtocolVersion
		if revision.MatchString(version) {
			v = "MCP " + version
		}
		cannot = "Your client speaks " + v + ", which cannot use the tasks extension (" + tasks.ExtensionID + ", declared per request from revision " + tasks.ProtocolVersion + "), so it cannot wait for an out-of-band decision here. " +
			"Retry from a client that speaks " + tasks.ProtocolVersion + " with tasks, or ask a person to request the access."
	}
	return denied("This call needs an approval ("+why+") and did not run. "+cannot, RemediationUndisclosed)
}

// revision is the form of an MCP protocol revision (a date).
var revision = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}$`)

// tasksCapable reports whether a request of protocol revision version can
// use the tasks extension: it is declared in the request's own _meta
// (clientCapabilities), which revisions before 2026-07-28 do not carry.
// Revisions are dates, so they order as strings.
func tasksCapable(version string) bool {
	return revision.MatchString(version) && version >= tasks.ProtocolVersion
}

// protocolOf is the protocol revision of a request: its _meta's (2026-07-28
// and later), else its MCP-Protocol-Version header, else the session's
// negotiated one; "" if none says.
func protocolOf(req *sdk.CallToolRequest) string {
	if v, ok := req.Params.GetMeta()[tasks.MetaProtocolVersion].(string); ok {
		return v
	}
	if req.Extra != nil && req.Extra.Header != nil {
		if v := req.Extra.Header.Get(tasks.HeaderProtocolVersion); v != "" {
			return v
		}
	}
	if req.Session != nil {
		if ip := req.Session.InitializeParams(); ip != nil {
			return ip.ProtocolVersion
		}
	}
	return ""
}

// rpcError is a JSON-RPC error result.
func rpcError(code int64, msg string) *jsonrpc.Error { return &jsonrpc.Error{Code: code, Message: msg} }

// describe is model-safe text about what the approval is for, taken from the
// backend's display hints and sanitized.
func describe(hint *authzen.AccessRequestHint) string {
	if hint == nil {
		return "approval required"
	}
	for _, k := range []string{"description", "title"} {
		if s, ok := hint.Display[k].(string); ok && s != "" {
			return sanitize(s, 160)
		}
	}
	return "approval required"
}

// sanitize keeps text safe to show a model: letters, digits, spaces and
// plain punctuation only, no markup or control characters, bounded length.
func sanitize(s string, max int) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == ' ':
			b.WriteRune(r)
		case strings.ContainsRune(".,:;$%()'-/?!_", r): // _: field names such as business_justification
			b.WriteRune(r)
		case unicode.IsSpace(r):
			b.WriteRune(' ')
		}
	}
	out := strings.Join(strings.Fields(b.String()), " ")
	if len(out) > max {
		out = strings.TrimSpace(out[:max]) + "..."
	}
	return out
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
