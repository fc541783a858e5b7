package arap

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/internal/announce"
)

// changesWriteTimeout bounds each write on a change stream (the server's
// write timeout is for a response, not a stream).
const changesWriteTimeout = 10 * time.Second

// decisionChanges is GET /v1/decisions/changes (scope evaluate): the
// stream a front-end's decision cache hears, as text/event-stream. It
// starts with a hello once this replica hears every change (package
// announce), carries a change for each one after, a comment every
// keepalive, and ends when this replica stops hearing them, when the
// client is revoked (after that change), or at shutdown. A client revoked
// in the 5 seconds its token may still be remembered (clients.CacheTTL)
// is refused here all the same: its stream is checked against the table.
func (s *Server) decisionChanges(w http.ResponseWriter, r *http.Request) {
	hub := s.d.Changes
	if hub == nil {
		writeProblem(w, r, authzen.ProblemNotFound, "this server has no change stream", nil)
		return
	}
	c := clientFrom(r)
	// Subscribed before the check, so a revocation between them ends it.
	sub, epoch, err := hub.Subscribe(c.ID)
	if errors.Is(err, announce.ErrNotListening) {
		w.Header().Set("Retry-After", "1")
		writeProblem(w, r, authzen.ProblemUnavailable, "this replica is not hearing changes now; retry after 1 second", nil)
		return
	}
	defer sub.Close()
	live, err := s.d.Clients.Get(r.Context(), c.ID)
	if errors.Is(err, clients.ErrNotFound) || (err == nil && live.RevokedAt != nil) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="arap", error="invalid_token"`)
		writeProblem(w, r, authzen.ProblemUnauthorized, "the bearer token is unknown or revoked", nil)
		return
	}
	if err != nil {
		s.internal(w, r, err)
		return
	}

	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	write := func(text string) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(changesWriteTimeout))
		if _, err := io.WriteString(w, text); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	event := func(name string, data any) bool {
		b, _ := json.Marshal(data)
		return write(fmt.Sprintf("event: %s\ndata: %s\n\n", name, b))
	}
	keepalive := hub.KeepaliveEvery()
	if !event(authzen.EventHello, map[string]any{"epoch": epoch, "keepalive": keepalive.Seconds(), "settle": hub.Settle.Seconds()}) {
		return
	}
	tick := time.NewTicker(keepalive)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-sub.Done():
			return
		case <-sub.Wake():
			ch, ok := sub.Take()
			if !ok {
				continue
			}
			if !event(authzen.EventChange, map[string]any{"epoch": ch.Epoch, "kind": ch.Kind}) || ch.Revoked {
				return
			}
		case <-tick.C:
			if !write(":\n\n") {
				return
			}
		}
	}
}
