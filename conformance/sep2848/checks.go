package sep2848

// Checks is the registry: every check the suite can report, with the
// scenario that evaluates it. conformance/sep-2848.yaml refers to these ids.
var Checks = []Check{
	{"sep-2848-capability-declared", "capability", "MUST", "the server declares io.modelcontextprotocol/tasks alongside io.modelcontextprotocol/tool-approval, and serves tasks/get and tasks/cancel (an unknown task is refused as such, not as an unknown method)"},

	{"sep-2848-requestable-denial-returns-task", "requestable-denial", "MUST", "a requestable denial for a client that declares only the tasks extension returns CreateTaskResult (resultType task, status working)"},
	{"sep-2848-tool-approval-optional", "requestable-denial", "MUST", "declaring io.modelcontextprotocol/tool-approval is optional: a tasks-only client and an approval-aware one both get the task"},
	{"sep-2848-requestable-denial-not-executed", "requestable-denial", "MUST", "the tool does not run on the requestable denial"},
	{"sep-2848-envelope-on-create", "requestable-denial", "MUST", "a SEP-2643 server puts the envelope (insufficient_authorization, available, task hint) on CreateTaskResult"},
	{"sep-2848-envelope-repeated-on-get", "requestable-denial", "MUST", "tasks/get of the waiting task, by its client and by a second one knowing only the taskId, reads working with the envelope (available, task hint) and no result or disposition"},
	{"sep-2848-pending-not-presented-completed", "requestable-denial", "MUST", "a working task carries no result and its model-facing text does not present it as done"},
	{"sep-2848-model-text-sanitized", "requestable-denial", "MUST", "statusMessage and model-immediate-response carry no client-supplied (untrusted) text and no control characters"},
	{"sep-2848-ttl-covers-pending", "requestable-denial", "MUST", "createdAt + ttlMs covers the pending deadline plus the result retention (or ttlMs is null)"},

	{"sep-2848-approval-executes", "approve", "MUST", "after approval the task completes approved-executed, isError false"},
	{"sep-2848-executes-once", "approve", "MUST", "the approved tool runs exactly once, and repeated tasks/get does not run it again"},
	{"sep-2848-runs-from-full-binding", "approve", "MUST", "the run uses the complete arguments of the call (the result repeats the profile's echoed arguments)"},
	{"sep-2848-body-states-ran", "approve", "MUST", "the CallToolResult body states that the tool ran"},
	{"sep-2848-no-envelope-on-success", "approve", "MUST", "no denial envelope on an approved-executed task or result"},
	{"sep-2848-ttl-covers-retention", "approve", "MUST", "at terminalization createdAt + ttlMs covers the terminal time plus the result retention (or ttlMs is null)"},
	{"sep-2848-terminal-not-reopened", "approve", "MUST", "a terminal task is not reopened: an identical call later is a new task, the old one is unchanged, and nothing runs on the old approval"},
	{"sep-2848-cancel-terminal-noop", "approve", "MUST", "tasks/cancel on a completed task changes nothing"},

	{"sep-2848-denial-completed-not-failed", "deny", "MUST", "a backend denial completes the task with isError true (not failed)"},
	{"sep-2848-denial-disposition", "deny", "MUST", "the result _meta carries disposition denied-not-executed"},
	{"sep-2848-denial-body-states-not-run", "deny", "MUST", "the CallToolResult body states that the tool did not run"},
	{"sep-2848-denial-envelope-unavailable", "deny", "MUST", "a SEP-2643 server's terminal denial carries the envelope with remediation unavailable"},
	{"sep-2848-denial-not-executed", "deny", "MUST", "the denied tool never runs"},
	{"sep-2848-no-approver-leak", "deny", "MUST", "neither the approver's reason nor the approver's identity ever reaches the client"},

	{"sep-2848-execution-error-disposition", "execution-error", "MUST", "an approved tool that fails completes isError with disposition execution-error"},
	{"sep-2848-no-envelope-on-execution-error", "execution-error", "MUST", "no denial envelope on an execution-error result"},
	{"sep-2848-execution-error-body-distinct", "execution-error", "MUST", "the execution-error body says the tool ran (or may have run), never that it did not"},

	{"sep-2848-outcome-unknown-disposition", "outcome-unknown", "MUST", "a claimed run whose outcome cannot be confirmed completes outcome-unknown, isError, no envelope, the body saying it may have run, and the result retained (createdAt + ttlMs covers its end plus the result retention)"},
	{"sep-2848-outcome-unknown-not-reinvoked", "outcome-unknown", "MUST", "the stalled run is never invoked again: exactly the effects it left (none before invoking, one after)"},
	{"sep-2848-claim-keeps-working", "outcome-unknown", "MUST", "between the claim and the stored result the task reads working, with no result"},

	{"sep-2848-binding-checked-before-run", "changed-binding", "MUST", "approving a call runs exactly its bound call (its arguments in the result, one effect of its amount), though a call with changed arguments and a tasks/update naming them came while it waited; the changed call's task still waits"},
	{"sep-2848-changed-arguments-new-approval", "changed-binding", "MUST", "a call with changed arguments gets a task of its own, while the original waits and after its approval, and does not run"},
	{"sep-2848-changed-tool-new-approval", "changed-binding", "MUST", "after an approval, a call of another tool gets a new task of its own"},
	{"sep-2848-changed-principal-new-approval", "changed-binding", "MUST", "another principal's identical call gets its own task, never the first principal's, and the first principal's approved call, made again by the other, runs nothing"},

	{"sep-2848-cancel-wins-before-claim", "cancel", "MUST", "tasks/cancel on a pending task moves it to cancelled"},
	{"sep-2848-cancelled-never-executes", "cancel", "MUST", "a cancelled task never runs: an approval that reached the server before the cancel (its grant still provisioning) runs nothing and the task stays cancelled; after a winning cancel the backend's request is cancelled (when the resolver can read it), and an approval given later runs nothing and leaves the task cancelled"},
	{"sep-2848-cancel-race-one-outcome", "cancel", "MUST", "approval and cancel sent together end either cancelled with no effect or completed with exactly one, never both"},
	{"sep-2848-cancelled-no-disposition", "cancel", "MUST", "a cancelled task carries no result, no disposition and no envelope"},
	{"sep-2848-backend-cancel-cancelled", "cancel", "MUST", "a request cancelled at the backend moves the task to cancelled, with no result, no disposition and no envelope, and the tool does not run"},
	{"sep-2848-notification-does-not-cancel", "cancel", "MUST", "notifications/cancelled does not cancel a task"},

	{"sep-2848-retry-not-denial", "retry", "MUST", "while re-evaluation answers retry the task reads working, the envelope available, no result (never a denial), then runs once"},

	{"sep-2848-expired-denied", "expiry", "MUST", "a request that expires unresolved completes isError, denied-not-executed, the envelope unavailable, the body noting expiry and that the tool did not run"},
	{"sep-2848-expired-fenced", "expiry", "MUST", "the expired task runs nothing, and an approval given after the expiry (which the backend may refuse) changes nothing and runs nothing"},

	{"sep-2848-expired-never-executes", "approval-expiry", "MUST", "an approval that expires before it can be used never runs the tool, though the backend still reports it granted"},
	{"sep-2848-retry-stops-at-expiry", "approval-expiry", "MUST", "once the approval has expired the task stops retrying on it: it ends denied or asks for a new approval"},
	{"sep-2848-chain-bounded", "approval-expiry", "MUST", "when the approval expires unused, new requests are made while the task waits (working, envelope available, no result), up to the bound, where it ends isError, denied-not-executed, envelope unavailable, the body noting the expiry and that the tool did not run"},

	{"sep-2848-input-required-envelope", "in-task-input", "MUST", "a task asking for input in-task reads input_required with inputRequests, the envelope remediation available, no result, and a statusMessage that does not present it as done"},
	{"sep-2848-update-checks-input-keys", "in-task-input", "MUST", "tasks/update takes only outstanding input keys: an unknown key changes nothing, the asked key returns the task to working"},

	{"sep-2848-input-before-submission", "input", "SHOULD", "submission input is asked for on the tools/call itself (resultType input_required, inputRequests, requestState), no standalone server request beside it"},
	{"sep-2848-mrtr-binding-enforced", "input", "MUST", "an MRTR retry with changed arguments, or naming another tool, is rejected"},
	{"sep-2848-mrtr-caller-enforced", "input", "MUST", "an MRTR retry by another principal is rejected"},
	{"sep-2848-input-retry-creates-task", "input", "SHOULD", "the MRTR retry with answers returns the CreateTaskResult"},

	{"sep-2848-task-access-get", "access-control", "MUST", "another principal's tasks/get is refused"},
	{"sep-2848-task-access-update", "access-control", "MUST", "another principal's tasks/update is refused and changes nothing"},
	{"sep-2848-task-access-cancel", "access-control", "MUST", "another principal's tasks/cancel is refused and changes nothing"},
	{"sep-2848-task-id-unguessable", "access-control", "MUST", "task ids are long, distinct, opaque handles that differ in many positions (not counters or timestamps)"},

	{"sep-2848-dedup-same-task", "dedup", "SHOULD", "a repeated identical requestable call returns the existing task"},
	{"sep-2848-dedup-concurrent", "dedup", "SHOULD", "concurrent identical calls open one task"},

	{"sep-2848-degraded-without-tasks", "degraded", "MUST", "without the tasks extension: -32003/-32021 naming tasks, or an isError CallToolResult saying an approval is needed and what to do next; never a task, never a run"},
	{"sep-2848-degraded-preferred", "degraded", "SHOULD", "the degraded isError CallToolResult says the tool did not run, that an approval is needed, and what to do next"},
	{"sep-2848-task-required-error", "degraded", "MUST", "a task-only tool without the tasks extension fails with -32003/-32021 naming the tasks extension"},

	{"sep-2848-plain-denial-no-task", "plain-denial", "MUST", "a denial that is not requestable is a normal isError CallToolResult with text describing it, no task, no run"},

	{"sep-2848-pending-bounded", "limits", "SHOULD", "a caller with the most pending approval tasks allowed gets a denial that is not requestable (no task, no run)"},
	{"sep-2848-submission-rate-limited", "limits", "MUST", "a caller over its submission rate, with nothing pending, gets a denial that is not requestable (no task, no run)"},

	{"sep-2848-no-backend-artifacts", "artifacts", "MUST", "no MCP response of the whole run carries backend binding material or endpoints"},
	{"sep-2848-no-authorization-context-id", "artifacts", "MUST", "no MCP response of the whole run carries SEP-2643's authorizationContextId"},
	{"sep-2848-body-disposition-agree", "artifacts", "MUST", "in every completed result of the run the body agrees with the disposition (ran, did not run, may have run), and so does the envelope (unavailable on a denial from a SEP-2643 server, none otherwise)"},
	{"sep-2848-disposition-on-every-completed", "artifacts", "MUST", "every completed task the run saw carries a string disposition in its result's _meta"},
	{"sep-2848-model-text-sanitized-run", "artifacts", "MUST", "no statusMessage or model-immediate-response the run saw, of any task in any state, repeats its call's client-supplied text or carries control characters"},
}
