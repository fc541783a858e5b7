package arap

import (
	"net/http"
	"strconv"
	"time"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/authzen"
)

// auditStream is GET /v1/audit: the audit trail a page at a time, in the
// stream order of audit.Read, for SIEMs. ?since=RFC3339 picks where the
// first page starts; ?after=CURSOR (a page's next_cursor) goes on from
// there; ?limit=N (1..1000, default 100).
func (s *Server) auditStream(w http.ResponseWriter, r *http.Request) {
	if s.d.Audit == nil {
		writeProblem(w, r, authzen.ProblemNotFound, "this server does not serve its audit trail", nil)
		return
	}
	q := r.URL.Query()
	limit := audit.DefaultPageSize
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > audit.MaxPageSize {
			writeProblem(w, r, authzen.ProblemInvalidRequest, "limit must be an integer from 1 to "+strconv.Itoa(audit.MaxPageSize), nil)
			return
		}
		limit = n
	}
	after, since := q.Get("after"), q.Get("since")
	c := audit.Start(time.Time{})
	switch {
	case after != "" && since != "":
		writeProblem(w, r, authzen.ProblemInvalidRequest, "give since or after, not both: since starts the first page, after (a next_cursor) carries it on", nil)
		return
	case after != "":
		var err error
		if c, err = audit.ParseCursor(after); err != nil {
			writeProblem(w, r, authzen.ProblemInvalidRequest, "after is not a cursor this server issued (use a page's next_cursor)", nil)
			return
		}
	case since != "":
		t, err := time.Parse(time.RFC3339Nano, since)
		if err != nil {
			writeProblem(w, r, authzen.ProblemInvalidRequest, "since must be an RFC 3339 time, e.g. 2026-01-02T15:04:05Z", nil)
			return
		}
		c = audit.Start(t)
	}
	page, err := audit.Read(r.Context(), s.d.Audit, c, limit)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, page)
}
