package arap

import (
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/go-chi/chi/v5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/openapi"
)

func loadDocument(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(openapi.Spec)
	require.NoError(t, err)
	return doc
}

// TestDocumentListsEveryProblemType: openapi/arap.yaml has one schema per
// problem code of the problem table, with the same type URI and status, and
// some response lists each; it has no problem type the server cannot answer.
func TestDocumentListsEveryProblemType(t *testing.T) {
	doc := loadDocument(t)
	inDoc := map[string]bool{}
	for name := range doc.Components.Schemas {
		if code, ok := strings.CutPrefix(name, "problem."); ok {
			inDoc[code] = true
		}
	}
	for code, p := range problems {
		s := doc.Components.Schemas["problem."+code]
		require.NotNil(t, s, "openapi/arap.yaml has no schema problem.%s", code)
		require.Equal(t, authzen.ProblemType(code), s.Value.Properties["type"].Value.Const, code)
		require.EqualValues(t, p.status, s.Value.Properties["status"].Value.Const, code)
		require.True(t, strings.Contains(string(openapi.Spec), `"#/components/schemas/problem.`+code+`"`), "no response lists problem.%s", code)
		delete(inDoc, code)
	}
	require.Empty(t, inDoc, "problem types the server does not have")
}

// TestDocumentListsEveryRoute: the document describes exactly the routes of
// routes.go (the web UI aside), method by method.
func TestDocumentListsEveryRoute(t *testing.T) {
	// As served without --metrics-addr (/metrics on the main listener).
	s := &Server{d: Deps{Log: slog.New(slog.DiscardHandler), Metrics: http.NotFoundHandler()}}
	var served []string
	require.NoError(t, chi.Walk(s.routes().(chi.Routes), func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		if len(route) > 1 {
			route = strings.TrimSuffix(route, "/")
		}
		served = append(served, method+" "+route)
		return nil
	}))
	var documented []string
	for path, item := range loadDocument(t).Paths.Map() {
		for method := range item.Operations() {
			documented = append(documented, method+" "+path)
		}
	}
	sort.Strings(served)
	require.ElementsMatch(t, served, documented)
}
