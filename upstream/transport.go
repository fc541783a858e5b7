package upstream

// The HTTP side of a connection: the round tripper that knows whether a
// request was written, keeps credentials to their origin, and reads a
// forwarded request's own event stream for the progress and log messages
// about it.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// sentKey carries, in a call's context, the flag the transports set once
// the tools/call request has been written: the line between NotSent and
// MaybeSent.
type sentKey struct{}

func sentFlag(ctx context.Context) *atomic.Bool {
	f, _ := ctx.Value(sentKey{}).(*atomic.Bool)
	return f
}

// roundTripper adds the upstream's headers and credential to every request
// and, for the POST that carries a tools/call, records when it was written.
type roundTripper struct {
	base *http.Transport
	u    *Upstream
}

func (rt *roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	if !sameOrigin(req.URL, rt.u.HTTP.URL) {
		return nil, errors.New("refusing a request outside the upstream's origin")
	}
	for k, v := range rt.u.HTTP.Headers {
		req.Header.Set(k, v)
	}
	if cr := rt.u.Credentials; cr != nil {
		req.Header.Set(cr.Header, cr.headerValue())
	}
	if f := sentFlag(req.Context()); f != nil && req.Method == http.MethodPost && isForwarded(req) {
		// Headers on the wire are enough for a server to start; from then on
		// the outcome is unknown.
		trace := &httptrace.ClientTrace{WroteHeaders: func() { f.Store(true) }}
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
	}
	resp, err := rt.base.RoundTrip(req)
	if err == nil && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		// The SDK reads a JSON response whole; SSE events it bounds itself.
		resp.Body = &cappedBody{ReadCloser: resp.Body, left: maxJSONResponse + 1}
	}
	if rel, ok := req.Context().Value(relayKey{}).(*relay); ok && err == nil &&
		req.Method == http.MethodPost && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		// This POST's own stream: its notifications are about this request.
		resp.Body = &relayTap{ReadCloser: resp.Body, rel: rel}
	}
	return resp, err
}

// relayKey carries, in a forwarded request's context, where the upstream's
// notifications about that request go (CallOptions.Log and .Progress).
type relayKey struct{}

type relay struct {
	log      func(*mcp.LoggingMessageParams)
	progress func(*mcp.ProgressNotificationParams)
	token    string // the gateway's progress token for the request
}

// relayTap passes an SSE response body through unchanged and hands the
// log and progress notifications in it to rel as the SDK reads them, so
// before the result that follows them. The stream of a POST carries only
// messages related to that request (streamable HTTP), which is what ties a
// log message to its request; the SDK's own client hands notifications
// over without that tie, and on another goroutine than the result.
type relayTap struct {
	io.ReadCloser
	rel  *relay
	line []byte // the current line, so far
	data []byte // the current event's data
	skip bool   // the current event is over the bound: not relayed
}

func (t *relayTap) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	t.scan(p[:n])
	return n, err
}

func (t *relayTap) scan(b []byte) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			t.line = append(t.line, b...)
			t.bound()
			return
		}
		t.line = append(t.line, b[:i]...)
		t.bound()
		t.event(bytes.TrimSuffix(t.line, []byte("\r")))
		t.line, b = t.line[:0], b[i+1:]
	}
}

// bound drops an event larger than the SDK would take.
func (t *relayTap) bound() {
	if len(t.line)+len(t.data) > maxJSONResponse {
		t.skip, t.line, t.data = true, t.line[:0], t.data[:0]
	}
}

func (t *relayTap) event(line []byte) {
	if len(line) > 0 {
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok && !t.skip {
			if len(t.data) > 0 {
				t.data = append(t.data, '\n')
			}
			t.data = append(t.data, bytes.TrimPrefix(d, []byte(" "))...)
		}
		return
	}
	data, skip := t.data, t.skip
	t.data, t.skip = t.data[:0], false
	if skip || len(data) == 0 {
		return
	}
	var msg struct {
		Method string          `json:"method"`
		Params json.RawMessage `json:"params"`
	}
	if json.Unmarshal(data, &msg) != nil {
		return
	}
	switch {
	case msg.Method == "notifications/message" && t.rel.log != nil:
		var p mcp.LoggingMessageParams
		if json.Unmarshal(msg.Params, &p) == nil {
			t.rel.log(&p)
		}
	case msg.Method == "notifications/progress" && t.rel.progress != nil:
		var p mcp.ProgressNotificationParams
		if json.Unmarshal(msg.Params, &p) == nil && p.ProgressToken == t.rel.token {
			t.rel.progress(&p)
		}
	}
}

// maxJSONResponse bounds one JSON response from an upstream, as the SDK
// bounds one SSE event.
const maxJSONResponse = mcp.DefaultMaxEventSize

type cappedBody struct {
	io.ReadCloser
	left int64
}

func (b *cappedBody) Read(p []byte) (int, error) {
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	if b.left <= 0 {
		return n, fmt.Errorf("response larger than %d bytes", maxJSONResponse)
	}
	return n, err
}

// sameOrigin reports whether u has the scheme and host of the configured
// endpoint: headers and the credential go nowhere else.
func sameOrigin(u *url.URL, endpoint string) bool {
	e, err := url.Parse(endpoint)
	return err == nil && u.Scheme == e.Scheme && u.Host == e.Host
}

// isForwarded reports whether req carries one of the requests forwarded on
// a caller's behalf (see forwarded).
func isForwarded(req *http.Request) bool {
	if req.GetBody == nil {
		return true // cannot tell: assume it is, which errs toward MaybeSent
	}
	body, err := req.GetBody()
	if err != nil {
		return true
	}
	defer body.Close()
	var m struct {
		Method string `json:"method"`
	}
	_ = json.NewDecoder(body).Decode(&m)
	return forwarded[m.Method]
}

// forwarded are the methods the gateway sends on a caller's behalf; the
// moment one is written is the line between NotSent and MaybeSent.
var forwarded = map[string]bool{"tools/call": true, "resources/read": true, "prompts/get": true, "completion/complete": true}
