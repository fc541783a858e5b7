package upstream

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
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// conn is the registry's link to one upstream: a loop that connects, lists
// the tools, follows changes and reconnects with backoff.
type conn struct {
	name     string
	r        *Registry
	client   *mcp.Client
	ctx      context.Context
	cancel   context.CancelFunc
	kick     chan struct{} // re-list (or notice a lost session) now
	firstTry chan struct{} // closed after the first connect attempt
	done     chan struct{} // closed when the loop has ended and the session is closed
	calls    sync.WaitGroup

	mu       sync.Mutex
	cfg      Upstream
	session  *mcp.ClientSession
	protocol string
	err      error
	tools    []*mcp.Tool // the last list, kept while disconnected so names stay stable
	digests  []string
	// What else it offers, from its initialize result, and the last lists
	// of its resources, resource templates and prompts.
	offers    Offers
	resources []*mcp.Resource
	templates []*mcp.ResourceTemplate
	prompts   []*mcp.Prompt
}

func (r *Registry) newConn(u Upstream) *conn {
	ctx, cancel := context.WithCancel(context.Background())
	c := &conn{name: u.Name, r: r, cfg: u, ctx: ctx, cancel: cancel,
		kick: make(chan struct{}, 1), firstTry: make(chan struct{}), done: make(chan struct{})}
	c.client = mcp.NewClient(r.opts.Client, &mcp.ClientOptions{
		Logger: r.opts.Logger,
		// No roots, sampling or elicitation: the gateway answers no
		// server-initiated requests on its callers' behalf.
		Capabilities: &mcp.ClientCapabilities{},
		// An upstream's input_required result (MRTR) is its caller's to
		// answer: prompts/get and resources/read pass it back as it came
		// (and the caller's retry forward); the SDK would try to answer it
		// here, with handlers the gateway does not have.
		MultiRoundTrip:             &mcp.MultiRoundTripOptions{Disabled: true},
		ToolListChangedHandler:     func(context.Context, *mcp.ToolListChangedRequest) { c.poke() },
		ResourceListChangedHandler: func(context.Context, *mcp.ResourceListChangedRequest) { c.poke() },
		PromptListChangedHandler:   func(context.Context, *mcp.PromptListChangedRequest) { c.poke() },
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			if req.Params != nil {
				r.updated(c.name, req.Params.URI)
			}
		},
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			if c.config().Stdio == nil {
				// An HTTP upstream's progress is read off the request's own
				// stream (relayTap), in order with its result; the SDK hands
				// it here on another goroutine, which may be too late.
				return
			}
			if f, ok := r.prog.Load(req.Params.ProgressToken); ok {
				f.(func(*mcp.ProgressNotificationParams))(req.Params)
			}
		},
	})
	r.mu.Lock()
	r.live[c] = true
	r.mu.Unlock()
	go c.run()
	return c
}

func (c *conn) config() *Upstream {
	c.mu.Lock()
	defer c.mu.Unlock()
	u := c.cfg
	return &u
}

func (c *conn) setConfig(u Upstream) {
	c.mu.Lock()
	changed := c.cfg.Relist != u.Relist
	c.cfg = u
	c.mu.Unlock()
	if changed {
		c.poke() // serve picks up the new period
	}
}

func (c *conn) poke() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func (c *conn) run() {
	defer func() {
		c.r.mu.Lock()
		delete(c.r.live, c)
		c.r.mu.Unlock()
		close(c.done)
	}()
	backoff := c.r.opts.MinBackoff
	first := true
	for {
		sess, err := c.connect()
		if err != nil {
			c.mu.Lock()
			c.session, c.err = nil, err
			c.mu.Unlock()
		}
		if first {
			close(c.firstTry) // after c.err is set, so a reload reports it
			first = false
		}
		if err == nil {
			backoff = c.r.opts.MinBackoff
			err = c.serve(sess)
		}
		if c.ctx.Err() != nil {
			return
		}
		c.mu.Lock()
		c.session, c.err = nil, err
		c.mu.Unlock()
		c.r.opts.Logger.Warn("upstream unavailable", "upstream", c.name, "error", err.Error(), "retry_in", backoff.String())
		select {
		case <-c.ctx.Done():
			return
		case <-time.After(jitter(backoff)):
		}
		backoff = min(2*backoff, c.r.opts.MaxBackoff)
	}
}

// connect opens a session and lists the tools, within the connect timeout.
// The returned error is safe to show: it names what failed, not where.
func (c *conn) connect() (*mcp.ClientSession, error) {
	u := c.config()
	ctx, cancel := context.WithTimeout(c.ctx, u.Connect)
	defer cancel()
	t, err := c.transport(u)
	if err != nil {
		return nil, err
	}
	sess, err := c.client.Connect(ctx, t, nil)
	if err != nil {
		return nil, fmt.Errorf("connect: %s", describe(ctx, u, err, u.Connect))
	}
	c.mu.Lock()
	c.session, c.protocol, c.err = sess, sess.InitializeResult().ProtocolVersion, nil
	c.offers = offersOf(sess.InitializeResult().Capabilities, u.HTTP != nil)
	c.mu.Unlock()
	if err := c.list(ctx, sess); err != nil {
		_ = sess.Close()
		return nil, err
	}
	// A new session knows none of the subscriptions of the last one.
	c.r.resubscribe(ctx, c, sess)
	c.r.opts.Logger.Info("upstream connected", "upstream", c.name, "protocol", c.protocol)
	return sess, nil
}

// serve follows the session until it is lost or the conn is stopped:
// re-listing on tools/list_changed, on the relist period (for upstreams that
// send no notifications), and when a call saw a transport failure.
func (c *conn) serve(sess *mcp.ClientSession) error {
	defer sess.Close()
	lost := make(chan error, 1)
	go func() { lost <- sess.Wait() }()
	period := c.config().Relist
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return c.ctx.Err()
		case err := <-lost:
			return fmt.Errorf("connection lost: %s", describe(c.ctx, c.config(), err, 0))
		case <-c.kick:
		case <-tick.C:
		}
		u := c.config()
		if u.Relist != period {
			period = u.Relist
			tick.Reset(period)
		}
		ctx, cancel := context.WithTimeout(c.ctx, u.Call)
		err := c.list(ctx, sess)
		cancel()
		if err != nil {
			return err
		}
	}
}

// list reads every page of the upstream's tools and publishes them.
func (c *conn) list(ctx context.Context, sess *mcp.ClientSession) error {
	u := c.config()
	var tools []*mcp.Tool
	var digests []string
	for t, err := range sess.Tools(ctx, nil) {
		if err != nil {
			return fmt.Errorf("tools/list: %s", describe(ctx, u, err, u.Call))
		}
		if len(tools) == maxTools {
			return fmt.Errorf("tools/list: more than %d tools", maxTools)
		}
		d, err := digest(t)
		if err != nil {
			return fmt.Errorf("tools/list: tool %q: %v", t.Name, err)
		}
		tools, digests = append(tools, t), append(digests, d)
	}
	res, tmpl, prompts, err := c.listMore(ctx, sess, u)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.tools, c.digests = tools, digests
	c.resources, c.templates, c.prompts = res, tmpl, prompts
	c.mu.Unlock()
	c.r.rebuild()
	return nil
}

// transport builds a fresh transport: stdio children get a clean
// environment; HTTP requests carry the configured headers and credential.
func (c *conn) transport(u *Upstream) (mcp.Transport, error) {
	if u.Stdio != nil {
		cmd := exec.Command(u.Stdio.Command, u.Stdio.Args...)
		cmd.Dir = u.Stdio.Dir
		for _, k := range []string{"PATH", "HOME", "LANG"} {
			if v, ok := os.LookupEnv(k); ok {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
		}
		for k, v := range u.Stdio.Env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		if u.Credentials != nil {
			cmd.Env = append(cmd.Env, u.Credentials.AsEnv+"="+secretOf(u.Credentials))
		}
		if cmd.Env == nil {
			cmd.Env = []string{}
		}
		return &stdioTransport{&mcp.CommandTransport{Command: cmd}}, nil
	}
	base := http.DefaultTransport.(*http.Transport).Clone()
	// Calls from many callers run at once on one session, each its own
	// POST: keep their connections for reuse (net/http keeps two per host
	// by default, and dialled and closed one for every call past those).
	base.MaxIdleConns, base.MaxIdleConnsPerHost = maxIdleConns, maxIdleConns
	client := &http.Client{
		Transport: &roundTripper{base: base, u: u},
		// An MCP endpoint has no business redirecting; following one would
		// carry the credential to wherever it points.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return &mcp.StreamableClientTransport{
		Endpoint:   u.HTTP.URL,
		HTTPClient: client,
		// A stream lost mid-call is resumed at most twice before the call
		// fails (and is reported MaybeSent); the call timeout bounds it too.
		MaxRetries: 2,
	}, nil
}

// maxIdleConns bounds the idle connections kept to one upstream: more than
// the calls a replica usually has in flight to it.
const maxIdleConns = 128

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

// stdioTransport wraps the command transport to record when a tools/call
// has been written to the child's stdin.
type stdioTransport struct{ mcp.Transport }

func (t *stdioTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	conn, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &stdioConn{conn}, nil
}

type stdioConn struct{ mcp.Connection }

func (c *stdioConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	err := c.Connection.Write(ctx, msg)
	if req, ok := msg.(*jsonrpc.Request); ok && forwarded[req.Method] {
		// A write refused by a closed pipe delivered nothing; any other
		// failure may have delivered part or all of the line.
		if f := sentFlag(ctx); f != nil && (err == nil || !closedPipe(err)) {
			f.Store(true)
		}
	}
	return err
}

func closedPipe(err error) bool {
	return errors.Is(err, syscall.EPIPE) || errors.Is(err, os.ErrClosed) || errors.Is(err, io.ErrClosedPipe) || errors.Is(err, mcp.ErrConnectionClosed)
}

// describe says what went wrong in words safe for a client: no URL, host,
// header or credential (anything of the upstream's configuration that
// appears in err's text is redacted).
func describe(ctx context.Context, u *Upstream, err error, limit time.Duration) string {
	var opErr interface{ Timeout() bool }
	switch {
	case errors.Is(err, context.DeadlineExceeded) && limit > 0:
		return fmt.Sprintf("no answer within %s", limit)
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		return "connection reset"
	case errors.As(err, &opErr) && opErr.Timeout():
		return "network timeout"
	case errors.Is(err, exec.ErrNotFound):
		return "command not found"
	case errors.Is(err, mcp.ErrConnectionClosed):
		return "connection closed"
	case errors.Is(err, mcp.ErrSessionMissing):
		return "the upstream no longer knows the session"
	}
	if we := upstreamError(err); we != nil {
		return fmt.Sprintf("protocol error %d: %s", we.Code, clip(u.redact(we.Message)))
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return "the process exited: " + ee.String()
	}
	if ctx.Err() != nil {
		return "cancelled"
	}
	return clip(u.redact(err.Error()))
}

// clip bounds text taken from an upstream.
func clip(s string) string {
	const n = 300
	if len(s) <= n {
		return s
	}
	return string(bytes.ToValidUTF8([]byte(s[:n]), nil)) + "..."
}
