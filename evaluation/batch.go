package evaluation

import (
	"context"
	"fmt"

	"github.com/omcp/arap/authzen"
)

// Items expands a batch request: each item takes the top-level subject,
// resource, action and context as defaults, and a member it sets replaces the
// default whole (AuthZEN 1.0 section 7.1). A batch without items is a single
// evaluation of the top-level members.
func Items(b authzen.EvaluationsRequest) []authzen.EvaluationRequest {
	if len(b.Evaluations) == 0 {
		return []authzen.EvaluationRequest{{Subject: b.Subject, Resource: b.Resource, Action: b.Action, Context: b.Context}}
	}
	out := make([]authzen.EvaluationRequest, len(b.Evaluations))
	for i, it := range b.Evaluations {
		out[i] = authzen.EvaluationRequest{
			Subject:  orDefault(it.Subject, b.Subject),
			Resource: orDefault(it.Resource, b.Resource),
			Action:   orDefault(it.Action, b.Action),
			Context:  orDefault(it.Context, b.Context),
		}
	}
	return out
}

func orDefault(v, def authzen.Object) authzen.Object {
	if v != nil {
		return v
	}
	return def
}

// ValidateBatch checks the semantic option and every expanded item.
func ValidateBatch(b authzen.EvaluationsRequest) []string {
	var out []string
	switch b.Options.EvaluationsSemantic {
	case "", authzen.SemanticExecuteAll, authzen.SemanticDenyOnFirstDeny, authzen.SemanticPermitOnFirstPermit:
	default:
		out = append(out, fmt.Sprintf("options.evaluations_semantic: %q is not one of %s, %s, %s; use one of these", b.Options.EvaluationsSemantic,
			authzen.SemanticExecuteAll, authzen.SemanticDenyOnFirstDeny, authzen.SemanticPermitOnFirstPermit))
	}
	for i, it := range Items(b) {
		for _, v := range ValidateRequest(it) {
			if len(b.Evaluations) > 0 {
				// Every message starts with the field it is about.
				v = fmt.Sprintf("evaluations[%d].%s", i, v)
			}
			out = append(out, v)
		}
	}
	return out
}

// EvaluateBatch decides every item in order, stopping early as the semantic
// says: deny_on_first_deny stops after the first deny, permit_on_first_permit
// after the first permit; the response then has fewer items than the request.
func (e *Engine) EvaluateBatch(ctx context.Context, callerID string, b authzen.EvaluationsRequest) ([]Outcome, error) {
	items := Items(b)
	out := make([]Outcome, 0, len(items))
	// Items about the same subject share one subject lookup.
	ctx = withLookupCache(ctx)
	for _, it := range items {
		o, err := e.Evaluate(ctx, callerID, it)
		if err != nil {
			return nil, err
		}
		out = append(out, o)
		switch b.Options.EvaluationsSemantic {
		case authzen.SemanticDenyOnFirstDeny:
			if !o.Decision.Decision {
				return out, nil
			}
		case authzen.SemanticPermitOnFirstPermit:
			if o.Decision.Decision {
				return out, nil
			}
		}
	}
	return out, nil
}

// BatchItem is how a batch (POST /access/v1/evaluations) answers one
// outcome. A plain decision, an allow or a deny that is neither requestable
// nor the answer to a presented approval, is {"decision": b} alone: AuthZEN
// batch callers (the working group's interop harness among them) compare
// items exactly, and a plain decision's evaluation_id and reason name
// nothing stored and ask nothing of the PEP. A requestable denial keeps its
// whole context (access_request, evaluation_id, evaluated_at, reason), which
// ARAP needs to submit a request, and so does a re-evaluation's answer
// (reason, next_action), which tells the PEP what to do next. The single
// endpoint keeps the diagnostic context on every decision.
func (o Outcome) BatchItem() authzen.Decision {
	if o.Reeval {
		return o.Decision
	}
	if _, requestable := o.Decision.Context[authzen.CtxAccessRequest]; requestable {
		return o.Decision
	}
	return authzen.Decision{Decision: o.Decision.Decision}
}
