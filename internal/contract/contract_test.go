package contract

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/openapi"
	"github.com/omcp/arap/requests"
)

// TestCheckerCatchesMismatches shows the checker can fail: wrong shapes,
// undocumented statuses and endpoints, and wrong media types are reported.
func TestCheckerCatchesMismatches(t *testing.T) {
	c, err := New()
	require.NoError(t, err)
	json := http.Header{"Content-Type": {"application/json"}}
	problem := http.Header{"Content-Type": {"application/problem+json"}}
	get := func(path string) *http.Request { return httptest.NewRequest("GET", "http://x"+path, nil) }

	good := `{"task":{"id":"arq_1","status":"pending","status_endpoint":"http://x/access/v1/requests/arq_1"}}`
	require.NoError(t, c.Check(get("/access/v1/requests/arq_1"), 200, json, []byte(good)))
	require.Error(t, c.Check(get("/access/v1/requests/arq_1"), 200, json, []byte(`{"task":{"id":1}}`)), "wrong shape")
	require.Error(t, c.Check(get("/access/v1/requests/arq_1"), 200, json, []byte(`{"task":{"id":"arq_1","status":"maybe","status_endpoint":"http://x"}}`)), "unknown status")
	require.NoError(t, c.Check(get("/access/v1/requests/arq_1"), 404, problem, []byte(`{"type":"https://x/unknown_task","title":"Unknown task","status":404}`)))
	require.Error(t, c.Check(get("/access/v1/requests/arq_1"), 404, json, []byte(`{"error":"no"}`)), "errors are problem documents")
	require.Error(t, c.Check(get("/v1/secret"), 200, json, []byte(`{}`)), "undocumented endpoint")
	require.NoError(t, c.Check(get("/v1/secret"), 404, problem, []byte(`{"type":"x","title":"Not found","status":404}`)))
	view := `{"id":"arq_1","status":"approved","rule":"r","subject":{},"action":{},"resource":{},"submitted_by":"c","created_at":"2026-11-29T00:00:00Z",
		"expires_at":"2026-11-30T00:00:00Z","approval_policy":{},"votes":[],"progress":{"quorum":1,"approvals":1},"you_may_decide":false,
		"approval":{"id":"apr_1","state":"eyJ..."}}`
	require.Error(t, c.Check(get("/v1/requests/arq_1"), 200, json, []byte(view)), "deciders never see approval.state")
	require.NoError(t, c.Check(get("/ui/"), 200, http.Header{"Content-Type": {"text/html"}}, []byte("<html>")))
}

// TestStatusEnumMatchesStateMachine keeps the document's request states and
// the state machine's the same set.
func TestStatusEnumMatchesStateMachine(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(openapi.Spec)
	require.NoError(t, err)
	var inDoc []string
	for _, v := range doc.Components.Schemas["RequestStatus"].Value.Enum {
		inDoc = append(inDoc, v.(string))
	}
	var inCode []string
	for _, s := range requests.AllStatuses {
		inCode = append(inCode, string(s))
	}
	require.ElementsMatch(t, inCode, inDoc)
}
