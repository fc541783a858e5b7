package authzen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client is a PEP's client of a PDP and its Access Request Service: it
// evaluates, submits access requests, reads task status and cancels.
type Client struct {
	// BaseURL is the PDP (e.g. https://arap.example.com); endpoints are the
	// AuthZEN defaults under it. URLs the service hands out (status
	// endpoints, links) must share its origin.
	BaseURL string
	// Token is the client's bearer token.
	Token string
	// HTTP is the client to use; a 30-second-timeout client when nil.
	HTTP *http.Client
}

// ProblemError is a refusal from the service: an RFC 9457 problem (ARAP) or a
// plain AuthZEN error.
type ProblemError struct {
	Status  int
	Problem Problem
}

func (e *ProblemError) Error() string {
	if e.Problem.Detail != "" {
		return fmt.Sprintf("%d %s: %s", e.Status, e.Code(), e.Problem.Detail)
	}
	return fmt.Sprintf("%d %s", e.Status, e.Code())
}

// Code is the problem code (the part after the URN prefix).
func (e *ProblemError) Code() string {
	t := strings.TrimPrefix(e.Problem.Type, ProblemPrefix)
	return strings.TrimPrefix(t, LocalProblemPrefix)
}

// IsProblem reports whether err is a ProblemError with the given code.
func IsProblem(err error, code string) bool {
	var pe *ProblemError
	return errors.As(err, &pe) && pe.Code() == code
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

// sameOrigin refuses URLs that leave the service, so a response cannot steer
// the PEP's credentials elsewhere.
func (c *Client) sameOrigin(raw string) error {
	base, err1 := url.Parse(c.BaseURL)
	u, err2 := url.Parse(raw)
	if err1 != nil || err2 != nil || u.Scheme != base.Scheme || u.Host != base.Host {
		return fmt.Errorf("authzen: refusing URL %q outside %s", raw, c.BaseURL)
	}
	return nil
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
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return resp.Header, err
	}
	if resp.StatusCode >= 300 {
		pe := &ProblemError{Status: resp.StatusCode}
		if json.Unmarshal(raw, &pe.Problem) != nil || pe.Problem.Type == "" {
			pe.Problem = Problem{Type: "about:blank", Title: resp.Status, Status: resp.StatusCode, Detail: strings.TrimSpace(string(raw))}
		}
		return resp.Header, pe
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.Header, fmt.Errorf("authzen: decode %s %s: %w", method, rawURL, err)
		}
	}
	return resp.Header, nil
}

// Evaluate asks the PDP for a decision.
func (c *Client) Evaluate(ctx context.Context, req EvaluationRequest) (Decision, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return Decision{}, err
	}
	var d Decision
	_, err = c.do(ctx, http.MethodPost, strings.TrimRight(c.BaseURL, "/")+PathEvaluation, body, nil, &d)
	return d, err
}

// Submit sends an access request body to endpoint under an Idempotency-Key.
func (c *Client) Submit(ctx context.Context, endpoint, key string, body []byte) (TaskResponse, error) {
	var tr TaskResponse
	_, err := c.do(ctx, http.MethodPost, endpoint, body, http.Header{HeaderIdempotencyKey: {key}}, &tr)
	return tr, err
}

// Status reads a task from its status endpoint, with the Retry-After the
// service asks pollers to honour.
func (c *Client) Status(ctx context.Context, statusURL string) (TaskResponse, time.Duration, error) {
	var tr TaskResponse
	h, err := c.do(ctx, http.MethodGet, statusURL, nil, nil, &tr)
	var after time.Duration
	if h != nil {
		if n, perr := strconv.Atoi(h.Get("Retry-After")); perr == nil && n > 0 {
			after = time.Duration(n) * time.Second
		}
	}
	return tr, after, err
}

// Cancel cancels a task through its cancel link.
func (c *Client) Cancel(ctx context.Context, cancelURL, reason string) (TaskResponse, error) {
	body, _ := json.Marshal(map[string]string{"reason": reason})
	var tr TaskResponse
	_, err := c.do(ctx, http.MethodPost, cancelURL, body, nil, &tr)
	return tr, err
}

// Schema fetches a request schema (request_schema_url).
func (c *Client) Schema(ctx context.Context, schemaURL string) (map[string]any, error) {
	var s map[string]any
	_, err := c.do(ctx, http.MethodGet, schemaURL, nil, nil, &s)
	return s, err
}
