// Package contract checks real HTTP responses of the backend against its
// OpenAPI description (openapi/arap.yaml). Tests put Proxy in front of a
// backend: every response that passes through is validated, and a response
// the document does not describe fails the test.
package contract

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
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

// Checker validates responses against the document.
type Checker struct {
	router routers.Router
}

// New loads and validates the document.
func New() (*Checker, error) {
	registerOnce.Do(func() {
		for _, ct := range []string{"application/problem+json", "application/jwk-set+json", "application/schema+json"} {
			openapi3filter.RegisterBodyDecoder(ct, openapi3filter.JSONBodyDecoder)
		}
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
	return &Checker{router: r}, nil
}

// Check validates one response to req. Paths the document leaves out on
// purpose (the HTML web UI) are not checked; any other path must be
// described, unless the answer is a 404 or 405 for it.
func (c *Checker) Check(req *http.Request, status int, header http.Header, body []byte) error {
	if strings.HasPrefix(req.URL.Path, "/ui") {
		return nil
	}
	route, params, err := c.router.FindRoute(req)
	if err != nil {
		if status == http.StatusNotFound || status == http.StatusMethodNotAllowed {
			return nil
		}
		return fmt.Errorf("%s %s answered %d but is not in openapi/arap.yaml: %v", req.Method, req.URL.Path, status, err)
	}
	opts := &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true, AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: opts}
	err = openapi3filter.ValidateResponse(req.Context(), &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: status, Header: header, Body: io.NopCloser(bytes.NewReader(body)), Options: opts,
	})
	if err != nil {
		return fmt.Errorf("%s %s -> %d does not match openapi/arap.yaml: %v\nbody: %.500s", req.Method, req.URL.Path, status, err, body)
	}
	return nil
}

// Proxy starts a reverse proxy to target on loopback whose responses are
// checked; a mismatch fails t. It returns the proxy's URL. listener, when
// not nil, is used for the proxy (so its address can be known beforehand).
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
	rp.ModifyResponse = func(resp *http.Response) error {
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		if err := c.Check(resp.Request, resp.StatusCode, resp.Header, body); err != nil {
			t.Errorf("contract: %v", err)
		}
		return nil
	}
	if srv == nil {
		srv = httptest.NewUnstartedServer(nil)
	}
	srv.Config.Handler = rp
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}
