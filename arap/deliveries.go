package arap

import (
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/callbacks"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/requests"
)

// DeliveriesResponse lists a request's callback deliveries.
type DeliveriesResponse struct {
	Deliveries []callbacks.Delivery `json:"deliveries"`
}

// ownRequest loads request id if the caller submitted it (or is an admin).
func (s *Server) ownRequest(w http.ResponseWriter, r *http.Request) (*requests.Request, bool) {
	req, err := s.d.Requests.Load(r.Context(), chi.URLParam(r, "id"))
	if err != nil {
		s.fail(w, r, err)
		return nil, false
	}
	c := clientFrom(r)
	if req.ClientID != c.ID && !c.Has(clients.ScopeAdmin) {
		writeProblem(w, r, authzen.ProblemUnknownTask, "no access request with this id is visible to this client", nil)
		return nil, false
	}
	return req, true
}

func (s *Server) deliveries(w http.ResponseWriter, r *http.Request) {
	req, ok := s.ownRequest(w, r)
	if !ok {
		return
	}
	list, err := s.d.Callbacks.Deliveries(r.Context(), req.ID)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	if list == nil {
		list = []callbacks.Delivery{}
	}
	writeJSON(w, http.StatusOK, DeliveriesResponse{Deliveries: list})
}

func (s *Server) redeliver(w http.ResponseWriter, r *http.Request) {
	req, ok := s.ownRequest(w, r)
	if !ok {
		return
	}
	if err := s.d.Callbacks.Redeliver(r.Context(), req.ID, chi.URLParam(r, "delivery"), clientFrom(r).Principal()); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]string{"status": "redelivering"})
}
