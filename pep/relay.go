package pep

import (
	"context"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// relays are the callbacks that put an upstream's notifications about a
// request forwarded on a caller's behalf on that caller's stream of the
// request: progress under the caller's own progressToken (the upstream saw
// a token of the gateway's), and log messages at the level the request
// asked for (2026-07-28's per-request _meta logLevel; the SDK's
// ServerSession.Log drops what is below it). A request that asked for
// neither gets neither. Nothing of them goes to the gateway's own logs.
// The tasks extension supports neither for tasks: an approved task's run
// gets none.
func relays(ctx context.Context, sess *sdk.ServerSession, meta map[string]any) (progress func(*sdk.ProgressNotificationParams), log func(*sdk.LoggingMessageParams)) {
	if sess == nil {
		return nil, nil
	}
	if tok := meta["progressToken"]; tok != nil {
		progress = func(p *sdk.ProgressNotificationParams) {
			q := *p
			q.ProgressToken, q.Meta = tok, nil
			_ = sess.NotifyProgress(ctx, &q) // the request may have ended meanwhile
		}
	}
	if _, ok := meta[sdk.MetaKeyLogLevel]; ok || legacySession(sess) {
		// 2026-07-28: the request's own level; 2025-11-25: the session's
		// (logging/setLevel), which sess.Log applies.
		log = func(p *sdk.LoggingMessageParams) {
			q := *p
			q.Meta = nil
			_ = sess.Log(ctx, &q)
		}
	}
	return progress, log
}

// legacySession reports whether sess speaks a revision before 2026-07-28,
// whose log level is the session's, not the request's.
func legacySession(sess *sdk.ServerSession) bool {
	ip := sess.InitializeParams()
	return ip != nil && ip.ProtocolVersion != "" && ip.ProtocolVersion < "2026-07-28"
}

// upstreamMeta is meta as the upstream gets it: for a 2025-11-25 caller,
// whose requests carry no log level, with the most verbose one, so that the
// upstream logs and the caller's session level (applied when relaying)
// decides what reaches it.
func upstreamMeta(sess *sdk.ServerSession, meta map[string]any) map[string]any {
	if sess == nil || !legacySession(sess) {
		return meta
	}
	if _, ok := meta[sdk.MetaKeyLogLevel]; ok {
		return meta
	}
	out := make(map[string]any, len(meta)+1)
	for k, v := range meta {
		out[k] = v
	}
	out[sdk.MetaKeyLogLevel] = "debug"
	return out
}
