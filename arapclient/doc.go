// Package arapclient is the Go client of an arap backend, for the authors of
// policy enforcement points (PEPs) and of resolvers.
//
// A PEP asks the PDP for a decision (Evaluate). An allow lets the action
// run; a plain deny stops it; a requestable deny (Requestable) offers an
// access request, which Submit sends to the Access Request Service with a
// fresh Idempotency-Key. The PEP then waits (Wait: polling the authoritative
// status endpoint at the pace its Retry-After asks, woken early by a
// verified callback through Callbacks) and, once the request is approved,
// asks again with the approval (Reevaluate): only that answer's allow lets
// the action run. A task handle never authorizes anything by itself.
//
// Search and SearchAll ask the AuthZEN search APIs which subjects,
// resources or actions are allowed now (what needs an approval first is not
// among the results), page by page.
//
// Resolvers (ITSM systems, supervising agents, risk engines) use the
// decision API: Requests, Request, Decide, Revoke.
//
// Refusals come back as *ProblemError, the service's RFC 9457 problem
// document with its type; IsProblem tests for one code.
//
// The client keeps its connections open for reuse, so one Client serves a
// PEP's many concurrent calls; it refuses to follow a URL the service hands
// out (status endpoints, cancel links) to another origin, so a response
// cannot steer the client's bearer token elsewhere.
package arapclient
