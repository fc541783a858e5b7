// Package pep is the policy enforcement point: an MCP server (official Go
// SDK, protocol 2026-07-28, stateless) whose every tools/call is decided by
// the AuthZEN PDP. A requestable denial becomes a durable MCP task (the
// tasks extension, package mcp/tasks) bound to an ARAP access request; when
// the request is approved, the call is re-evaluated with the approval and,
// if allowed, executed exactly once behind an atomic claim. This is
// SEP-2848, io.modelcontextprotocol/tool-approval. Package frontend runs it
// as `arapd mcp`; it reaches the backend over HTTP only.
//
// The journey of one gated call, each file left for the next:
//
//	server.go   route: the caller's principal, tools/call to the gate
//	gate.go     Gate.Call: arguments, evaluation, dedup, limits, input (input.go)
//	open.go     open: intent, submit, bind; then the task store (mcp/tasks)
//	results.go  created: the CreateTaskResult
//
// and of its decision:
//
//	server.go   callback: a verified callback (or look.go: the look sweep)
//	advance.go  Wake, Advance: the status endpoint, reevaluate, chain
//	execute.go  execute: the claim, the run; its outcome through finish
//	end.go      finish (every ending, with the task store), deny, fail, cancel
//
// source.go is where tools come from (ToolSource: the demo tools are the
// built-in upstream "demo", an upstream MCP server another), read per call;
// a tool's identity (its Digest, recorded with the task and checked before
// re-evaluation and at the claim), and what the PDP sees of it. kind.go is
// the task as a tasks.Kind (tasks/cancel, tasks/update); state.go
// owns the tables of approval tasks and intents, lists their phases and states
// with the transitions between them, and holds, with stateopen.go,
// statemove.go and statesweep.go, every statement on them;
// binding.go is what a call is bound to; background.go is the gate's own
// goroutines (callback wake-ups, the look sweep of look.go, the
// reconciler), which Stop waits for. authenticate.go makes a request's
// token its principal; toolsync.go keeps the SDK server's tools the gate's;
// legacy.go says what a 2025-11-25 client is told besides. The
// claim and every way a task ends are recorded, in the same transaction, in
// the front-end's own hash-chained audit trail (audit.go), which VerifyAudit
// (arapctl audit verify --pep) checks. ops.go serves /readyz and writes
// the access log; metrics.go is what /metrics counts.
package pep
