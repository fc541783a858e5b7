package arap

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/evaluation"
)

// PolicyReload is the answer to POST /v1/admin/policy/reload.
type PolicyReload struct {
	Policy string `json:"policy"`
	Rules  int    `json:"rules"`
	// Announced says the other replicas were told to reload theirs.
	Announced bool `json:"announced"`
}

// reloadPolicy reloads the policy file (and has every replica reload
// theirs): 200 with what loaded, or 422 policy_invalid listing each problem
// as FILE:LINE: reason, the running policy kept.
func (s *Server) reloadPolicy(w http.ResponseWriter, r *http.Request) {
	if s.d.ReloadPolicy == nil {
		writeProblem(w, r, authzen.ProblemNotFound, "this server reloads its policy on SIGHUP only", nil)
		return
	}
	p, err := s.d.ReloadPolicy(r.Context())
	var perr *evaluation.Error
	switch {
	case errors.As(err, &perr):
		var lines []string
		for _, pr := range perr.Problems {
			lines = append(lines, problemLine(perr.Source, pr))
		}
		writeProblem(w, r, authzen.ProblemPolicyInvalid, "the policy file has errors; the running policy stays", lines)
		return
	case p == nil && err != nil:
		writeProblem(w, r, authzen.ProblemPolicyInvalid, "the policy cannot be loaded: "+err.Error()+"; the running policy stays", nil)
		return
	}
	writeJSON(w, http.StatusOK, PolicyReload{Policy: p.Source, Rules: len(p.Rules), Announced: err == nil})
}

func problemLine(source string, p evaluation.Problem) string {
	if p.Line > 0 {
		return source + ":" + strconv.Itoa(p.Line) + ": " + p.Message
	}
	return source + ": " + p.Message
}
