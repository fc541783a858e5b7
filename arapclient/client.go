package arapclient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/omcp/arap/authzen"
)

// Client is a client of one arap backend: its PDP, its Access Request
// Service and its decision API. The zero value is not usable; set BaseURL
// and Token. A Client is safe for concurrent use.
type Client struct {
	// BaseURL is the backend (e.g. https://arap.example.com); endpoints are
	// the AuthZEN defaults under it. URLs the service hands out (status
	// endpoints, links) must share its origin.
	BaseURL string
	// Token is the client's bearer token: scope evaluate for Evaluate and
	// the searches, request for Submit, Status, Cancel and Wait, decide for
	// the decision API.
	Token string
	// HTTP is the client to use; when nil, a shared client with a 30-second
	// timeout that keeps connections open for reuse.
	HTTP *http.Client
}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return defaultHTTP
}

// defaultHTTP keeps connections to the service open for reuse. A PEP calls
// the PDP once per tool call from many goroutines at once; with net/http's
// default of two idle connections per host, every call past the second in
// flight dialled a new connection and closed it afterwards (a TCP handshake
// on both sides and a socket in TIME_WAIT per call).
var defaultHTTP = &http.Client{Timeout: 30 * time.Second, Transport: pooled()}

// Pooled is a transport like the default client's (keeping connections
// open for reuse), for a client of one's own (a traced one).
func Pooled() *http.Transport { return pooled() }

// pooled is http.DefaultTransport with room for maxIdlePerHost idle
// connections per host.
func pooled() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = maxIdlePerHost
	t.MaxIdleConnsPerHost = maxIdlePerHost
	return t
}

// maxIdlePerHost bounds the idle connections the default client keeps per
// host: more than the concurrent calls a PEP replica usually has in flight.
const maxIdlePerHost = 128

// maxResponse bounds a response body read.
const maxResponse = 8 << 20

// url returns the default endpoint path under BaseURL.
func (c *Client) url(path string) string { return strings.TrimRight(c.BaseURL, "/") + path }

// sameOrigin refuses URLs that leave the service, so a response cannot steer
// the client's credentials elsewhere.
func (c *Client) sameOrigin(raw string) error {
	base, err1 := url.Parse(c.BaseURL)
	u, err2 := url.Parse(raw)
	if err1 != nil || err2 != nil || u.Scheme != base.Scheme || u.Host != base.Host {
		return fmt.Errorf("arapclient: refusing URL %q outside %s", raw, c.BaseURL)
	}
	return nil
}

// call marshals in (when not nil) and calls do.
func (c *Client) call(ctx context.Context, method, rawURL string, in, out any) (http.Header, error) {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return nil, err
		}
	}
	return c.do(ctx, method, rawURL, body, nil, out)
}

func (c *Client) do(ctx context.Context, method, rawURL string, body []byte, header http.Header, out any) (http.Header, error) {
	if err := c.sameOrigin(rawURL); err != nil {
		return nil, err
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, rawURL, rd)
	if err != nil {
		return nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return resp.Header, err
	}
	if resp.StatusCode >= 300 {
		return resp.Header, problemFrom(resp, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.Header, fmt.Errorf("arapclient: decode %s %s: %w", method, rawURL, err)
		}
	}
	return resp.Header, nil
}

// Evaluate asks the PDP for one decision (AuthZEN Access Evaluation). A
// requestable denial is decision false with context.access_request; see
// Requestable.
func (c *Client) Evaluate(ctx context.Context, req authzen.EvaluationRequest) (authzen.Decision, error) {
	var d authzen.Decision
	_, err := c.call(ctx, http.MethodPost, c.url(authzen.PathEvaluation), req, &d)
	return d, err
}

// Evaluations asks for a batch of decisions (AuthZEN Access Evaluations).
func (c *Client) Evaluations(ctx context.Context, req authzen.EvaluationsRequest) (authzen.EvaluationsResponse, error) {
	var out authzen.EvaluationsResponse
	_, err := c.call(ctx, http.MethodPost, c.url(authzen.PathEvaluations), req, &out)
	return out, err
}

// SubmitBody sends an access request body exactly as given to endpoint
// under key, the Idempotency-Key. It is for PEPs that persist the exact
// body and key before sending, so that a retry after a crash repeats them
// byte for byte (the backend then returns the same task); others use Submit.
func (c *Client) SubmitBody(ctx context.Context, endpoint, key string, body []byte) (authzen.TaskResponse, error) {
	var tr authzen.TaskResponse
	_, err := c.do(ctx, http.MethodPost, endpoint, body, http.Header{authzen.HeaderIdempotencyKey: {key}}, &tr)
	return tr, err
}

// Status reads a task from its status endpoint, the authoritative answer,
// with the Retry-After the service asks pollers to honour (0 when it sent
// none).
func (c *Client) Status(ctx context.Context, statusURL string) (authzen.TaskResponse, time.Duration, error) {
	var tr authzen.TaskResponse
	h, err := c.do(ctx, http.MethodGet, statusURL, nil, nil, &tr)
	return tr, retryAfter(h), err
}

// retryAfter reads a Retry-After header in seconds (the form the backend
// sends); 0 when absent or in another form.
func retryAfter(h http.Header) time.Duration {
	if h == nil {
		return 0
	}
	if n, err := strconv.Atoi(h.Get("Retry-After")); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return 0
}

// Cancel cancels a task through its cancel link (task.links.cancel);
// reason is a short code such as "no_longer_needed" (at most 64 printable
// characters, no spaces).
func (c *Client) Cancel(ctx context.Context, cancelURL, reason string) (authzen.TaskResponse, error) {
	var tr authzen.TaskResponse
	_, err := c.call(ctx, http.MethodPost, cancelURL, map[string]string{"reason": reason}, &tr)
	return tr, err
}

// Schema fetches a request schema (access_request.request_schema_url): the
// JSON Schema of what a submission must add, such as a justification.
func (c *Client) Schema(ctx context.Context, schemaURL string) (map[string]any, error) {
	var s map[string]any
	_, err := c.do(ctx, http.MethodGet, schemaURL, nil, nil, &s)
	return s, err
}

// Metadata reads the PDP's discovery document
// (/.well-known/authzen-configuration): its endpoints and capabilities.
func (c *Client) Metadata(ctx context.Context) (authzen.Metadata, error) {
	var m authzen.Metadata
	_, err := c.do(ctx, http.MethodGet, c.url(authzen.WellKnownPath), nil, nil, &m)
	return m, err
}
