// Package contract checks real HTTP exchanges with the backend against its
// OpenAPI description (openapi/arap.yaml). Tests put Proxy in front of a
// backend: every answer that passes through is checked, and one the document
// does not describe fails the test.
//
// The check is strict: a status the operation does not list fails (the
// document has no default responses), a body must match the schema of its
// status and media type (the server's own objects are closed, so an extra
// member fails), a problem document's status member must be the HTTP status,
// a response the document gives no body must have none, and a request the
// server accepted (2xx) must be one the document allows. Requests it refused
// are not checked: tests send invalid requests on purpose.
package contract

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/omcp/arap/openapi"
)

var registerOnce sync.Once

// Checker validates exchanges against the document.
type Checker struct {
	doc    *openapi3.T
	router routers.Router
	// unrouted are the answers to a path the document does not list, and
	// to a method it does not list for a path (the document's description
	// says which); they are checked like an operation's responses.
	unrouted, wrongMethod *openapi3.Operation
}

// New loads and validates the document.
func New() (*Checker, error) {
	registerOnce.Do(func() {
		for _, ct := range []string{"application/jwk-set+json", "application/schema+json"} {
			openapi3filter.RegisterBodyDecoder(ct, openapi3filter.JSONBodyDecoder)
		}
		openapi3filter.RegisterBodyDecoder("application/openmetrics-text", openapi3filter.PlainBodyDecoder)
		openapi3filter.RegisterBodyDecoder("text/event-stream", openapi3filter.PlainBodyDecoder)
	})
	doc, err := openapi3.NewLoader().LoadFromData(openapi.Spec)
	if err != nil {
		return nil, fmt.Errorf("contract: load openapi/arap.yaml: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("contract: openapi/arap.yaml is not valid OpenAPI: %w", err)
	}
	doc.Servers = nil // match paths on any host
	r, err := legacy.NewRouter(doc)
	if err != nil {
		return nil, err
	}
	c := &Checker{doc: doc, router: r}
	answers := func(names map[int]string) (*openapi3.Operation, error) {
		rs := openapi3.NewResponses()
		for status, name := range names {
			ref := doc.Components.Responses[name]
			if ref == nil {
				return nil, fmt.Errorf("contract: openapi/arap.yaml has no response %s", name)
			}
			rs.Set(fmt.Sprint(status), ref)
		}
		return &openapi3.Operation{Responses: rs}, nil
	}
	common := map[int]string{400: "InvalidRequest", 404: "NotFound", 500: "InternalError"}
	if c.unrouted, err = answers(common); err != nil {
		return nil, err
	}
	common[405] = "MethodNotAllowed"
	if c.wrongMethod, err = answers(common); err != nil {
		return nil, err
	}
	return c, nil
}

// isUI reports whether path is the approvers' web UI: HTML for people, left
// out of the document on purpose (its own tests check its pages).
func isUI(path string) bool { return path == "/ui" || strings.HasPrefix(path, "/ui/") }

// Check validates one exchange: the answer (status, header, body) to req,
// whose body was reqBody.
func (c *Checker) Check(req *http.Request, reqBody []byte, status int, header http.Header, body []byte) error {
	if isUI(req.URL.Path) {
		return nil
	}
	var errs []error
	if err := problemStatus(status, header, body); err != nil {
		errs = append(errs, err)
	}
	route, params, err := c.router.FindRoute(req)
	documented := err == nil
	if !documented {
		if !errors.As(err, new(*routers.RouteError)) {
			return err
		}
		op := c.unrouted
		if c.pathListed(req) {
			op = c.wrongMethod
		}
		route = &routers.Route{Spec: c.doc, Path: req.URL.Path, PathItem: &openapi3.PathItem{}, Method: req.Method, Operation: op}
	}
	opts := &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true, AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}
	// Where and why, without the schema and value dumps.
	opts.WithCustomSchemaErrorFunc(func(err *openapi3.SchemaError) string { return err.Reason })
	answer := route.Operation.Responses.Status(status)
	switch {
	case answer == nil:
		errs = append(errs, fmt.Errorf("%d is not an answer openapi/arap.yaml lists here (it lists %s)", status, strings.Join(listed(route.Operation), ", ")))
	case req.Method == http.MethodHead:
		// The validator skips HEAD; the server answers it 405 everywhere.
		if status != http.StatusMethodNotAllowed {
			errs = append(errs, fmt.Errorf("HEAD answered %d, not 405", status))
		}
	default:
		in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: opts}
		if err := openapi3filter.ValidateResponse(req.Context(), &openapi3filter.ResponseValidationInput{
			RequestValidationInput: in, Status: status, Header: header, Body: io.NopCloser(bytes.NewReader(body)), Options: opts,
		}); err != nil {
			errs = append(errs, err)
		}
		if len(answer.Value.Content) == 0 && len(body) > 0 {
			errs = append(errs, errors.New("the document gives this answer no body, but it has one"))
		}
	}
	if documented && status >= 200 && status < 300 {
		// The server accepted this request: the document must allow it.
		sent := req.Clone(req.Context())
		sent.Body = io.NopCloser(bytes.NewReader(reqBody))
		if err := openapi3filter.ValidateRequest(req.Context(), &openapi3filter.RequestValidationInput{
			Request: sent, PathParams: params, Route: route, Options: opts,
		}); err != nil {
			errs = append(errs, fmt.Errorf("the server accepted a request the document does not allow: %w", err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s %s -> %d does not match openapi/arap.yaml: %w\nbody: %.500s", req.Method, req.URL.Path, status, errors.Join(errs...), body)
	}
	return nil
}

func listed(op *openapi3.Operation) []string {
	var out []string
	for s := range op.Responses.Map() {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// pathListed reports whether the document lists req's path for any method.
// (The router says "method not allowed" only for paths without parameters.)
func (c *Checker) pathListed(req *http.Request) bool {
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		other := req.Clone(req.Context())
		other.Method = m
		if _, _, err := c.router.FindRoute(other); err == nil {
			return true
		}
	}
	return false
}

// problemStatus checks that a problem document's status member is the HTTP
// status (RFC 9457 section 3.1.3), whatever the document's schemas say.
func problemStatus(status int, header http.Header, body []byte) error {
	mt, _, _ := mime.ParseMediaType(header.Get("Content-Type"))
	if mt != "application/problem+json" {
		return nil
	}
	var p struct {
		Status *int `json:"status"`
	}
	if err := json.Unmarshal(body, &p); err != nil {
		return fmt.Errorf("the problem document is not JSON: %w", err)
	}
	if p.Status == nil || *p.Status != status {
		return fmt.Errorf("the problem document's status member is %v, the HTTP status %d", statusOf(p.Status), status)
	}
	return nil
}

func statusOf(p *int) any {
	if p == nil {
		return "missing"
	}
	return *p
}

type bodyKey struct{}

// Proxy starts a reverse proxy to target on loopback whose answers are
// checked; a mismatch fails t. It returns the proxy's URL. srv, when not
// nil, is the (unstarted) server to run the proxy on, so that its address
// can be known beforehand.
//
// The proxy reaches target from the loopback address its client came from
// (all of 127/8 is local on Linux), so a test of per-address behaviour can
// go through it too.
func Proxy(t testing.TB, target string, srv *httptest.Server) string {
	t.Helper()
	c, err := New()
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	tr := &sourceTransport{byIP: map[string]*http.Transport{}}
	t.Cleanup(tr.close)
	rp.Transport = tr
	rp.ModifyResponse = func(resp *http.Response) error {
		if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "text/event-stream" {
			// A stream passes as it comes (the proxy flushes each write):
			// its status and media type are checked, its events are not.
			reqBody, _ := resp.Request.Context().Value(bodyKey{}).([]byte)
			if err := c.Check(resp.Request, reqBody, resp.StatusCode, resp.Header, nil); err != nil {
				t.Errorf("contract: %v", err)
			}
			return nil
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		reqBody, _ := resp.Request.Context().Value(bodyKey{}).([]byte)
		if err := c.Check(resp.Request, reqBody, resp.StatusCode, resp.Header, body); err != nil {
			t.Errorf("contract: %v", err)
		}
		return nil
	}
	if srv == nil {
		srv = httptest.NewUnstartedServer(nil)
	}
	srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Keep the request body for the check; the length stays as sent
		// (chunked stays chunked), so the backend sees the same request.
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "contract proxy: reading the request body: "+err.Error(), http.StatusBadGateway)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		ctx := context.WithValue(r.Context(), bodyKey{}, body)
		if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
			ctx = context.WithValue(ctx, sourceKey{}, host)
		}
		rp.ServeHTTP(w, r.WithContext(ctx))
	})
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

type sourceKey struct{}

// sourceTransport dials from the client's own loopback address, one pool of
// connections per address.
type sourceTransport struct {
	mu   sync.Mutex
	byIP map[string]*http.Transport
}

func (s *sourceTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	ip, _ := r.Context().Value(sourceKey{}).(string)
	if a := net.ParseIP(ip); a == nil || !a.IsLoopback() || a.To4() == nil {
		ip = ""
	}
	s.mu.Lock()
	tr := s.byIP[ip]
	if tr == nil {
		d := &net.Dialer{}
		if ip != "" {
			d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(ip)}
		}
		tr = http.DefaultTransport.(*http.Transport).Clone()
		tr.DialContext = d.DialContext
		s.byIP[ip] = tr
	}
	s.mu.Unlock()
	return tr.RoundTrip(r)
}

func (s *sourceTransport) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, tr := range s.byIP {
		tr.CloseIdleConnections()
	}
}
