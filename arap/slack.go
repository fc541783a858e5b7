package arap

import (
	"errors"
	"io"
	"net/http"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/slackapp"
)

// slackInteractivity receives the Slack app's button clicks. Slack's
// signature over the exact body is the authentication (slackapp checks it,
// and refuses a replay); the body is bounded before it is read. Slack
// expects a 200 quickly; what a person should see goes to them ephemerally.
func (s *Server) slackInteractivity(w http.ResponseWriter, r *http.Request) {
	if s.d.Slack == nil {
		writeProblem(w, r, authzen.ProblemNotFound, "the Slack app is not configured on this server", nil)
		return
	}
	if r.ContentLength > slackapp.MaxBody {
		writeProblem(w, r, authzen.ProblemPayloadTooLarge, tooLarge(slackapp.MaxBody), nil)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, slackapp.MaxBody))
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		writeProblem(w, r, authzen.ProblemPayloadTooLarge, tooLarge(slackapp.MaxBody), nil)
		return
	}
	if err != nil {
		writeProblem(w, r, authzen.ProblemInvalidRequest, "could not read the request body", nil)
		return
	}
	err = s.d.Slack.Interact(r.Context(), r.Header, body)
	switch {
	case errors.Is(err, slackapp.ErrUnauthenticated):
		writeProblem(w, r, authzen.ProblemUnauthorized, "the request does not carry a valid, fresh, unused Slack signature", nil)
	case err != nil:
		s.internal(w, r, err)
	default:
		writeJSON(w, http.StatusOK, struct{}{})
	}
}
