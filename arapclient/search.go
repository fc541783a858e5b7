package arapclient

import (
	"context"
	"fmt"
	"iter"
	"net/http"

	"github.com/omcp/arap/authzen"
)

// Search asks one page of an AuthZEN search: kind is authzen.SearchSubject
// (which subjects of subject.type may do the action on the resource),
// authzen.SearchResource (which resources of resource.type the subject may
// do the action on) or authzen.SearchAction (which actions the subject may
// take on the resource). Results are only what is allowed now: what needs
// an approval first is not among them. Pass the response's
// Page.NextToken back in req.Page.Token, with req otherwise unchanged, for
// the next page; "" means there is none.
func (c *Client) Search(ctx context.Context, kind string, req authzen.SearchRequest) (authzen.SearchResponse, error) {
	path, ok := map[string]string{
		authzen.SearchSubject: authzen.PathSearchSubject, authzen.SearchResource: authzen.PathSearchResource, authzen.SearchAction: authzen.PathSearchAction,
	}[kind]
	if !ok {
		return authzen.SearchResponse{}, fmt.Errorf("arapclient: no search of kind %q", kind)
	}
	var out authzen.SearchResponse
	_, err := c.call(ctx, http.MethodPost, c.url(path), req, &out)
	return out, err
}

// SearchAll yields every result of a search, page after page, and stops at
// the first error (yielded with a nil result).
func (c *Client) SearchAll(ctx context.Context, kind string, req authzen.SearchRequest) iter.Seq2[authzen.Object, error] {
	return func(yield func(authzen.Object, error) bool) {
		page := authzen.PageParams{}
		if req.Page != nil {
			page = *req.Page
		}
		for {
			req.Page = &page
			resp, err := c.Search(ctx, kind, req)
			if err != nil {
				yield(nil, err)
				return
			}
			for _, r := range resp.Results {
				if !yield(r, nil) {
					return
				}
			}
			if resp.Page.NextToken == "" {
				return
			}
			page.Token = resp.Page.NextToken
		}
	}
}
