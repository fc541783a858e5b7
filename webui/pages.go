package webui

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/dbdown"
	"github.com/omcp/arap/requests"
)

func contextWith(r *http.Request, s *session) context.Context {
	return context.WithValue(r.Context(), ctxKey{}, s)
}

// queueData is the queue page's data.
type queueData struct {
	Items []Item
	Rule  string
	Rules []string
	All   bool // also list requests naming the person that they cannot decide
}

// queue lists the pending requests the person may decide (or, with
// show=all, every pending one naming them), newest first, filterable by rule.
func (u *UI) queue(w http.ResponseWriter, r *http.Request) {
	s := sessionFrom(r)
	v := u.voter(s)
	rule := r.URL.Query().Get("rule")
	list, _, err := u.d.Requests.List(r.Context(), &v, requests.ListOptions{Status: requests.Pending, Limit: 200})
	if err != nil {
		u.fail(w, r, err)
		return
	}
	votes, err := u.d.Requests.VotesOf(r.Context(), list)
	if err != nil {
		u.fail(w, r, err)
		return
	}
	d := queueData{Rule: rule, All: r.URL.Query().Get("show") == "all"}
	seen := map[string]bool{}
	for _, req := range list {
		if !seen[req.Rule] {
			seen[req.Rule] = true
			d.Rules = append(d.Rules, req.Rule)
		}
		if rule != "" && req.Rule != rule {
			continue
		}
		if it := u.item(req, votes[req.ID], v); it.MayDecide || d.All {
			d.Items = append(d.Items, it)
		}
	}
	u.render(w, r, "queue", http.StatusOK, page{Title: "Pending requests", User: s.user, CSRF: s.csrf, Refresh: true, Data: d,
		Flash: flash(r)})
}

func flash(r *http.Request) string {
	switch r.URL.Query().Get("done") {
	case "approve":
		return "Your approval was recorded."
	case "deny":
		return "Your denial was recorded."
	}
	return ""
}

// history lists ended requests the person was a decider of.
func (u *UI) history(w http.ResponseWriter, r *http.Request) {
	s := sessionFrom(r)
	v := u.voter(s)
	list, _, err := u.d.Requests.List(r.Context(), &v, requests.ListOptions{Limit: 200})
	if err != nil {
		u.fail(w, r, err)
		return
	}
	votes, err := u.d.Requests.VotesOf(r.Context(), list)
	if err != nil {
		u.fail(w, r, err)
		return
	}
	var items []Item
	for _, req := range list {
		if req.Status == requests.Pending {
			continue
		}
		items = append(items, u.item(req, votes[req.ID], v))
	}
	u.render(w, r, "history", http.StatusOK, page{Title: "History", User: s.user, CSRF: s.csrf, Refresh: true, Data: items})
}

// request shows one request in full, with the decision form when the person
// may decide it and the reason when not.
func (u *UI) request(w http.ResponseWriter, r *http.Request) {
	u.showRequest(w, r, chi.URLParam(r, "id"), http.StatusOK, "")
}

// showRequest renders the request page, with problem as an error banner
// (a refused decision re-renders the page rather than redirecting, so that
// no message text ever travels in a URL).
func (u *UI) showRequest(w http.ResponseWriter, r *http.Request, id string, status int, problem string) {
	s := sessionFrom(r)
	v := u.voter(s)
	req, err := u.d.Requests.Load(r.Context(), id)
	if err != nil || !requests.Names(v, req) {
		u.render(w, r, "request", http.StatusNotFound, page{Title: "Not found", User: s.user, CSRF: s.csrf,
			Error: "There is no such request, or you are not among its deciders."})
		return
	}
	votes, err := u.d.Requests.Votes(r.Context(), req.ID)
	if err != nil {
		u.fail(w, r, err)
		return
	}
	it := u.item(req, votes, v)
	if u.d.Clients != nil {
		// The name is the operator's, as the audit trail shows it
		// (client:NAME); a client deleted since leaves the id.
		it.SubmitterName, _ = u.d.Clients.NameOf(r.Context(), req.ClientID)
	}
	if it.Audit, err = audit.Chain(r.Context(), u.d.DB, req.ID); err != nil {
		u.fail(w, r, err)
		return
	}
	n := notes{List: it.Hidden, Omitted: it.HiddenOmitted}
	for _, a := range it.Audit {
		n.Text("the audit trail ("+a.Kind+")", a.Actor)
		n.Text("the audit trail ("+a.Kind+")", auditData(a.Data))
	}
	it.Hidden, it.HiddenOmitted = n.List, n.Omitted
	data := requestData{Item: it}
	if it.MayDecide {
		data.Approving = u.approving(req, votes)
	}
	if req.ApprovalPolicy.RequirePasskey {
		if data.Passkey, err = u.passkeyState(r, s.user.Name); err != nil {
			u.fail(w, r, err)
			return
		}
		data.Passkey.Required = true
	}
	var note string
	if problem == "" && r.URL.Query().Get("done") == "approve" && req.Status == requests.Pending {
		note = fmt.Sprintf("Your approval was recorded: %d of %d. The call runs when the rest are given.", it.Approvals, it.Quorum)
	}
	u.render(w, r, "request", status, page{Title: titleOf(it), User: s.user, CSRF: s.csrf, Refresh: problem == "", Data: data, Error: problem, Flash: note})
}

// requestData is the request page's data: the request, and what approving
// it would do.
type requestData struct {
	Item
	Approving approving
	Passkey   passkeyState
}

func titleOf(it Item) string {
	if it.Title != "" {
		return plain(it.Title + ": " + it.Tool)
	}
	return "Request for " + plain(it.Tool)
}

// decide records the person's vote. The form carries the CSRF token; the
// vote goes through the same eligibility and quorum rules as the API.
func (u *UI) decide(w http.ResponseWriter, r *http.Request) {
	s := sessionFrom(r)
	id := chi.URLParam(r, "id")
	if !u.checkCSRF(r, s.csrf) {
		http.Error(w, "missing or wrong CSRF token: reload the page and try again", http.StatusForbidden)
		return
	}
	decision := r.PostFormValue("decision")
	if decision != "approve" && decision != "deny" {
		http.Error(w, "decision must be approve or deny", http.StatusBadRequest)
		return
	}
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	d := requests.Decision{Approve: decision == "approve", Reason: reason}
	if problem := u.signedDecision(r, s, id, decision, &d); problem != "" {
		u.showRequest(w, r, id, http.StatusBadRequest, "Your decision was not recorded: "+problem+".")
		return
	}
	got, err := u.d.Requests.Decide(r.Context(), u.voter(s), id, d)
	var re *requests.Error
	if errors.As(err, &re) {
		status := http.StatusConflict
		switch re.Code {
		case authzen.ProblemInvalidRequest:
			status = http.StatusBadRequest
		case authzen.ProblemChannelNotAllowed, authzen.ProblemSignatureRequired:
			status = http.StatusForbidden
		}
		u.showRequest(w, r, id, status, "Your decision was not recorded: "+re.Detail+".")
		return
	}
	if err != nil {
		u.fail(w, r, err)
		return
	}
	if got != nil && got.Status == requests.Pending {
		// More approvals are needed: the request, at "1 of 2", is where
		// the approver's work shows (an empty queue would not).
		http.Redirect(w, r, "/ui/requests/"+id+"?done="+decision, http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, "/ui/?done="+decision, http.StatusSeeOther)
}

// fail answers a failure that is not the user's: 503 with Retry-After
// while the database is unavailable, otherwise 500.
func (u *UI) fail(w http.ResponseWriter, r *http.Request, err error) {
	if dbdown.Is(err) {
		u.d.Log.Warn("web UI: database unavailable", "path", r.URL.Path, "error", err)
		unavailable(w)
		return
	}
	u.d.Log.Error("web UI request failed", "path", r.URL.Path, "error", err)
	http.Error(w, "internal error", http.StatusInternalServerError)
}

// unavailable is the plain page shown while the database is unavailable.
func unavailable(w http.ResponseWriter) {
	w.Header().Set("Retry-After", dbdown.RetryAfterHeader)
	http.Error(w, "The service is temporarily unavailable (its database cannot be reached). Nothing was changed; try again in "+
		dbdown.RetryAfterHeader+" seconds.", http.StatusServiceUnavailable)
}
