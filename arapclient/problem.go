package arapclient

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/omcp/arap/authzen"
)

// ProblemError is a refusal from the service: its RFC 9457 problem document
// (ARAP and the decision API), or AuthZEN's plain error turned into one.
type ProblemError struct {
	// Status is the HTTP status code.
	Status int
	// Problem is the document; Problem.Type is the problem type URI, such
	// as urn:openid:authzen:access-request:error:expired_denial.
	Problem authzen.Problem
	// RetryAfter is the service's Retry-After (429 and 503), or 0.
	RetryAfter int
	// URL is what was asked.
	URL string
}

func (e *ProblemError) Error() string {
	if e.Problem.Type == "about:blank" {
		// Not a problem document: not arap's backend, or not a route of it.
		return fmt.Sprintf("%s answered %d without a problem document (%q): is that arap's backend (arapd serve, by default http://127.0.0.1:8480; not the MCP endpoint)?",
			e.URL, e.Status, e.Problem.Detail)
	}
	if e.Problem.Detail != "" {
		return fmt.Sprintf("%d %s: %s", e.Status, e.Code(), e.Problem.Detail)
	}
	return fmt.Sprintf("%d %s", e.Status, e.Code())
}

// Code is the problem code: the problem type without its URN prefix
// (authzen.ProblemExpiredDenial and the other authzen.Problem* constants).
func (e *ProblemError) Code() string {
	t := strings.TrimPrefix(e.Problem.Type, authzen.ProblemPrefix)
	return strings.TrimPrefix(t, authzen.LocalProblemPrefix)
}

// IsProblem reports whether err is, or wraps, a ProblemError with the given
// code (an authzen.Problem* constant).
func IsProblem(err error, code string) bool {
	var pe *ProblemError
	return errors.As(err, &pe) && pe.Code() == code
}

// problemFrom decodes an error response: a problem document when it is one,
// otherwise about:blank with the body as detail.
func problemFrom(resp *http.Response, raw []byte) *ProblemError {
	pe := &ProblemError{Status: resp.StatusCode}
	if resp.Request != nil && resp.Request.URL != nil {
		u := *resp.Request.URL
		u.RawQuery = "" // may carry a cursor, never a secret, but keep errors short
		pe.URL = u.String()
	}
	if s := resp.Header.Get("Retry-After"); s != "" {
		_, _ = fmt.Sscanf(s, "%d", &pe.RetryAfter)
	}
	if json.Unmarshal(raw, &pe.Problem) != nil || pe.Problem.Type == "" {
		detail := strings.TrimSpace(string(raw))
		if len(detail) > 512 {
			detail = detail[:512]
		}
		pe.Problem = authzen.Problem{Type: "about:blank", Title: resp.Status, Status: resp.StatusCode, Detail: detail}
	}
	return pe
}
