package authzen

// SearchRequest is a Subject, Resource or Action Search request (AuthZEN 1.0
// section 8): the request of an evaluation with the searched member reduced
// to its type (subject, resource) or left out (action), and a page.
type SearchRequest struct {
	Subject  Object      `json:"subject,omitempty"`
	Resource Object      `json:"resource,omitempty"`
	Action   Object      `json:"action,omitempty"`
	Context  Object      `json:"context,omitempty"`
	Page     *PageParams `json:"page,omitempty"`
}

// PageParams asks for one page: Token continues a search from where the
// previous page's next_token left it; Limit bounds the results.
type PageParams struct {
	Token string `json:"token,omitempty"`
	Limit int    `json:"limit,omitempty"`
}

// SearchResponse is a page of results: subjects or resources (objects with
// type and id) or actions (objects with name) the search's other members
// allow.
type SearchResponse struct {
	Results []Object   `json:"results"`
	Page    PageResult `json:"page"`
}

// PageResult says where the search goes on: NextToken is "" on the last
// page; Count is the number of results on this page.
type PageResult struct {
	NextToken string `json:"next_token"`
	Count     int    `json:"count"`
}
