// Package upstream connects the gateway (arapd mcp) to the MCP servers it
// fronts: it reads the upstreams file (Load, Parse), keeps one client
// session per upstream (Registry), merges their tools under the names the
// file exposes, and forwards calls.
//
// Its promise to the gate is about what happened to a call: a tool error is
// a result; an *Error says whether the request never left (NotSent: the tool
// did not run), was answered with a protocol error (Rejected), or was written
// and its answer lost (MaybeSent: outcome unknown). A call is never sent
// twice: the registry does not retry tools/call, so the gate can end a
// MaybeSent call outcome-unknown.
//
// It is a leaf of the front-end: it imports the MCP SDK and nothing of the
// backend or of pep.
package upstream
