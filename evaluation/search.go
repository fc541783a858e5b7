package evaluation

import (
	"context"
	"slices"

	"github.com/omcp/arap/authzen"
)

// Search (AuthZEN 1.0 section 8) answers "which subjects, resources or
// actions does this request allow" by deciding each candidate through
// Evaluate, the path every decision takes: a candidate is a result only when
// its decision is true. A requestable denial is false (the action needs an
// approval first), so what needs an approval is never in the results.
//
// The policy can only be asked about what it names: a rule's match names
// actions and resource ids; a rule that matches by condition alone (no
// action, or no resource_id) names none, so what only such a rule allows is
// not found by a search.

// MaxSearchExamined bounds the candidates one page decides, so that a page
// costs at most this many evaluations however few of them are allowed.
const MaxSearchExamined = 500

// SearchActions lists the action names the rules' matches name (action
// and actions), sorted:
// the candidates of an Action Search.
func (p *Policy) SearchActions() []string {
	var out []string
	for _, r := range p.Rules {
		for _, a := range append([]string{r.Match.Action}, r.Match.Actions...) {
			if a != "" && !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	slices.Sort(out)
	return out
}

// SearchResources lists the resource ids of type typ the rules' matches
// name (resource_id, with resource_type typ or none), sorted: the candidates
// of a Resource Search.
func (p *Policy) SearchResources(typ string) []string {
	var out []string
	for _, r := range p.Rules {
		m := r.Match
		if m.ResourceID != "" && (m.ResourceType == "" || m.ResourceType == typ) && !slices.Contains(out, m.ResourceID) {
			out = append(out, m.ResourceID)
		}
	}
	slices.Sort(out)
	return out
}

// SearchPage decides candidates from offset on, in order, for the API
// client callerID, until limit of them are allowed or MaxSearchExamined have
// been decided. It returns the indexes of the allowed ones and the index to
// go on from (len(candidates) when every candidate has been decided).
// Candidates must be valid requests (see ValidateRequest) without an
// approval in their context: a search asks what is allowed now.
func (e *Engine) SearchPage(ctx context.Context, callerID string, candidates []authzen.EvaluationRequest, offset, limit int) (allowed []int, next int, err error) {
	examined := 0
	i := offset
	for ; i < len(candidates) && len(allowed) < limit && examined < MaxSearchExamined; i++ {
		examined++
		out, err := e.Evaluate(ctx, callerID, candidates[i])
		if err != nil {
			return nil, 0, err
		}
		if out.Decision.Decision {
			allowed = append(allowed, i)
		}
	}
	return allowed, i, nil
}
