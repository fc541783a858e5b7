package arapclient

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
)

// AuditPage is a page of the backend's audit stream (GET /v1/audit). The
// events are kept as they came, each one JSON object with its chain, seq,
// hash and prev_hash, for a SIEM to store and verify.
type AuditPage struct {
	Events []json.RawMessage `json:"events"`
	Next   string            `json:"next_cursor"`
}

// AuditOptions pick a page: Since (RFC 3339) for the first, After (a
// page's Next) for the following ones.
type AuditOptions struct {
	Since, After string
	Limit        int // 0: the server's default
}

// Audit reads a page of the audit stream (scope audit).
func (c *Client) Audit(ctx context.Context, o AuditOptions) (AuditPage, error) {
	q := url.Values{}
	if o.Since != "" {
		q.Set("since", o.Since)
	}
	if o.After != "" {
		q.Set("after", o.After)
	}
	if o.Limit > 0 {
		q.Set("limit", fmt.Sprint(o.Limit))
	}
	u := c.url("/v1/audit")
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var p AuditPage
	_, err := c.call(ctx, http.MethodGet, u, nil, &p)
	return p, err
}
