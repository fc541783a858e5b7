package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
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
	name   string
	r      *Registry
	client *mcp.Client
	ctx    context.Context
	cancel context.CancelFunc
	kick   chan struct{} // re-list (or notice a lost session) now
	// announced are the lists the upstream said changed since the last
	// re-list (Announced bits).
	announced atomic.Uint32
	firstTry  chan struct{} // closed after the first connect attempt
	done      chan struct{} // closed when the loop has ended and the session is closed
	calls     sync.WaitGroup

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
		ToolListChangedHandler:     func(context.Context, *mcp.ToolListChangedRequest) { c.announce(AnnouncedTools) },
		ResourceListChangedHandler: func(context.Context, *mcp.ResourceListChangedRequest) { c.announce(AnnouncedResources) },
		PromptListChangedHandler:   func(context.Context, *mcp.PromptListChangedRequest) { c.announce(AnnouncedPrompts) },
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

// announce notes that the upstream said a list of kind changed, and has
// it re-listed; the announcement is passed on after the re-list.
func (c *conn) announce(kind Announced) {
	c.announced.Or(uint32(kind))
	c.poke()
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
		announced := Announced(c.announced.Swap(0))
		ctx, cancel := context.WithTimeout(c.ctx, u.Call)
		err := c.list(ctx, sess)
		cancel()
		if err != nil {
			return err
		}
		if announced != 0 {
			c.r.announced(announced)
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
