package upstream

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Kind says what is known about a failed call's effect.
type Kind int

const (
	// NotSent: the request never reached the upstream (not connected,
	// unreachable, unknown or changed tool); the tool did not run.
	NotSent Kind = iota + 1
	// Rejected: the upstream answered with a JSON-RPC error (unknown tool,
	// invalid arguments, internal error); the outcome is that answer.
	Rejected
	// MaybeSent: the request was written and its answer lost (timeout,
	// connection lost, caller gone); the tool may have run. Never retried.
	MaybeSent
)

func (k Kind) String() string {
	switch k {
	case NotSent:
		return "not sent"
	case Rejected:
		return "rejected"
	case MaybeSent:
		return "outcome unknown"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Sentinels a caller can test with errors.Is on an *Error.
var (
	ErrUnknownTool = errors.New("no such tool")
	// ErrNotOffered: no upstream offers the resource, prompt or completion
	// asked for; nothing was sent.
	ErrNotOffered  = errors.New("not offered by any upstream")
	ErrToolChanged = errors.New("the tool's definition changed")
)

// Error is a call that produced no result. Its message names the upstream
// and what happened, and is safe to show an MCP client: it never contains
// the upstream's URL, headers or credential. Unwrap gives the underlying
// error for operators' logs.
type Error struct {
	Upstream string // the upstream's name in the file; "" for an unknown tool
	Tool     string // the exposed tool name (a tools/call)
	Ref      string // what another request is about: `resource "URI"`, `prompt "name"`, `completion`
	Kind     Kind
	Code     int64 // Rejected: the upstream's JSON-RPC error code
	// RPC is, for Rejected, the upstream's error as it answered it (code,
	// message, data) with the upstream's address and credentials taken
	// out: what a gateway passes on to its client.
	RPC    *jsonrpc.Error
	Reason string // what happened, in client-safe words
	cause  error
}

func (e *Error) Error() string {
	about := e.Ref
	if about == "" {
		about = fmt.Sprintf("tool %q", e.Tool)
	}
	if e.Upstream == "" {
		return fmt.Sprintf("%s: %s: %s", about, e.Kind, e.Reason)
	}
	return fmt.Sprintf("upstream %q, %s: %s: %s", e.Upstream, about, e.Kind, e.Reason)
}

func (e *Error) Unwrap() error { return e.cause }

// Transient says the request was not sent for a reason that may pass (no
// connection, the request could not be written), as opposed to a tool that
// is unknown or changed, or a caller that gave up: the same request may be
// sent again, and nothing can have run twice.
func (e *Error) Transient() bool {
	return e.Kind == NotSent && !errors.Is(e.cause, ErrUnknownTool) && !errors.Is(e.cause, ErrToolChanged) &&
		!errors.Is(e.cause, context.Canceled) && !errors.Is(e.cause, context.DeadlineExceeded)
}

// CallOptions are optional parameters of Call and of the other forwarded
// requests (ReadResource, GetPrompt, Complete).
type CallOptions struct {
	// Digest, when set, is the Tool.Digest the caller decided on; a tool
	// whose definition has changed since is not called (NotSent,
	// ErrToolChanged).
	Digest string
	// Upstream and UpstreamTool, when set, are where the caller decided the
	// call goes: a name that moved to another upstream (or another of its
	// tools) since is not called (NotSent, ErrToolChanged). For the other
	// forwarded requests, Upstream is the owner the caller decided on: a
	// reload that gave the resource, prompt or completion to another
	// upstream meanwhile sends nothing (NotSent, ErrToolChanged).
	Upstream, UpstreamTool string
	// Progress receives the upstream's progress notifications for this
	// request. The upstream sees a token of the gateway's, never the
	// caller's.
	Progress func(*mcp.ProgressNotificationParams)
	// Log receives the upstream's log messages (notifications/message) sent
	// on this request's own stream. Only a streamable HTTP upstream says
	// which request a message is about; a stdio upstream's messages are not
	// relayed (they could be about another caller's request).
	Log func(*mcp.LoggingMessageParams)
	// Meta is the caller's _meta of a tools/call; what of it travels
	// upstream is callerMeta's. (The other requests carry it in their
	// params.)
	Meta mcp.Meta
	// RequestState and InputResponses continue an MRTR round the upstream
	// started on this tools/call (its input_required result).
	RequestState   string
	InputResponses mcp.InputResponseMap
}

// Call forwards one tools/call to the upstream that exposes name, at most
// once, within the upstream's call timeout. A result with IsError (a tool
// error) is returned as a result, and so is an MRTR input_required result
// (NeedsInput: the tool has not finished and asks its caller for input).
// Any other failure is an *Error whose Kind tells NotSent, Rejected and
// MaybeSent apart.
func (r *Registry) Call(ctx context.Context, name string, args map[string]any, o *CallOptions) (*mcp.CallToolResult, error) {
	if o == nil {
		o = &CallOptions{}
	}
	r.mu.Lock()
	i, ok := r.snap.byName[name]
	if !ok {
		r.mu.Unlock()
		return nil, &Error{Tool: name, Kind: NotSent, Reason: "no such tool", cause: ErrUnknownTool}
	}
	t := r.snap.tools[i]
	if (o.Digest != "" && o.Digest != t.Digest) || (o.Upstream != "" && (o.Upstream != t.Upstream || o.UpstreamTool != t.UpstreamTool)) {
		r.mu.Unlock()
		return nil, &Error{Upstream: t.Upstream, Tool: name, Kind: NotSent, Reason: "the tool's definition changed; it was not called", cause: ErrToolChanged}
	}
	c := r.take(t.Upstream) // under r.mu, so a reload retiring c waits for this call
	r.mu.Unlock()
	if c == nil {
		return nil, &Error{Upstream: t.Upstream, Tool: name, Kind: NotSent, Reason: "the upstream is not configured", cause: ErrUnknownTool}
	}
	var res *mcp.CallToolResult
	err := r.send(ctx, c, name, "", o, o.Meta, func(ctx context.Context, sess *mcp.ClientSession, meta mcp.Meta) (err error) {
		params := &mcp.CallToolParams{Name: t.UpstreamTool, Arguments: args, Meta: meta,
			RequestState: o.RequestState, InputResponses: o.InputResponses}
		res, err = sess.CallTool(ctx, params)
		return err
	})
	if err == nil && res.InputRequests != nil && !res.NeedsInput() {
		// Questions beside a result: not a round the caller can answer.
		return nil, &Error{Upstream: t.Upstream, Tool: name, Kind: Rejected,
			Reason: "the upstream answered with input requests outside an input_required result"}
	}
	return res, err
}

// send runs one forwarded request (do) on c's session within the call
// timeout, at most once, and types its failure: NotSent, Rejected or
// MaybeSent. The caller has done c.calls.Add(1) under r.mu; send marks it
// done. tool or ref names what the request is about in the error. do gets
// the _meta to send: what of the caller's meta travels (callerMeta) and, if
// o asks for progress, the gateway's own progress token.
func (r *Registry) send(ctx context.Context, c *conn, tool, ref string, o *CallOptions, meta mcp.Meta, do func(context.Context, *mcp.ClientSession, mcp.Meta) error) error {
	defer c.calls.Done()
	if o == nil {
		o = &CallOptions{}
	}
	meta = callerMeta(meta)
	rel := &relay{log: o.Log, progress: o.Progress}
	if o.Progress != nil {
		rel.token = fmt.Sprintf("arap-%d", r.seq.Add(1))
		r.prog.Store(rel.token, o.Progress)
		defer r.prog.Delete(rel.token)
		if meta == nil {
			meta = mcp.Meta{}
		}
		meta["progressToken"] = rel.token
	}
	c.mu.Lock()
	sess, u, lastErr := c.session, c.cfg, c.err
	c.mu.Unlock()
	fail := func(k Kind, reason string, cause error) error {
		return &Error{Upstream: c.name, Tool: tool, Ref: ref, Kind: k, Reason: reason, cause: cause}
	}
	if sess == nil {
		reason := "not connected"
		if lastErr != nil {
			reason += " (" + lastErr.Error() + ")"
		}
		return fail(NotSent, reason, lastErr)
	}

	// The call ends with ctx or after u.Call, whichever comes first. Once
	// its result is in, though, the caller's end no longer cuts the
	// connection: the SDK reads the rest of the response stream after it
	// has handed the result on, and a request cancelled before the stream's
	// end closes its connection rather than returning it to the pool (which
	// cost a new connection for most calls). It is cut after streamDrain at
	// most. The call's context holds nothing of ctx's (values included), so
	// what waits for streamDrain keeps no caller's request alive.
	callCtx, cancel := context.WithTimeout(context.Background(), u.Call)
	stop := context.AfterFunc(ctx, cancel)
	var sent atomic.Bool
	callCtx = context.WithValue(callCtx, sentKey{}, &sent)
	if o.Log != nil || o.Progress != nil {
		callCtx = context.WithValue(callCtx, relayKey{}, rel)
	}
	if ctx.Err() != nil { // AfterFunc cancels in its own goroutine: not yet, maybe
		stop()
		cancel()
		return fail(NotSent, "the request was abandoned before it was sent", ctx.Err())
	}
	err := do(callCtx, sess, meta)
	if err == nil {
		if stop() {
			time.AfterFunc(streamDrain, cancel)
		} else {
			cancel()
		}
		return nil
	}
	stop()
	defer cancel()
	we := upstreamError(err)
	switch {
	case !sent.Load():
		c.poke() // a transport failure: let the loop check the session
		return fail(NotSent, "the request could not be sent: "+describe(callCtx, &u, err, 0), err)
	case we != nil:
		return &Error{Upstream: c.name, Tool: tool, Ref: ref, Kind: Rejected, Code: we.Code, RPC: u.redactError(we),
			Reason: fmt.Sprintf("the upstream refused the request: %s (code %d)", clip(u.redact(we.Message)), we.Code), cause: err}
	case ctx.Err() != nil:
		return fail(MaybeSent, "the request was abandoned before the upstream answered", err)
	case callCtx.Err() != nil:
		return fail(MaybeSent, fmt.Sprintf("no answer within %s", u.Call), err)
	default:
		c.poke()
		return fail(MaybeSent, "the connection was lost before the upstream answered: "+describe(callCtx, &u, err, 0), err)
	}
}

// streamDrain bounds how long the rest of a response stream is read after
// the call's result (see send).
const streamDrain = time.Second

// upstreamError is the JSON-RPC error the upstream answered with, or nil.
// The SDK marks its own transport failures with a JSON-RPC error too
// (-32005 "rejected by transport", even when the request was written and
// the connection then dropped); that one is not an answer.
func upstreamError(err error) *jsonrpc.Error {
	var we *jsonrpc.Error
	if !errors.As(err, &we) || (we.Code == -32005 && we.Message == "rejected by transport") {
		return nil
	}
	return we
}
