package evaluation

import (
	"context"
	"time"

	"github.com/omcp/arap/authzen"
)

// Trial is a decision made offline, for `arapctl policy test`: the rule
// that decides req under p (nil: none, so deny), and for a requestable one
// the automated resolver whose condition holds (nil: none), exactly as
// Evaluate and the Access Request Service find them, but with the
// attributes and subject attributes given instead of read, and no keys.
type Trial struct {
	Rule     *Rule
	Resolver *Resolver
}

// TrialInputs are what a trial reads instead of the stores.
type TrialInputs struct {
	Attributes        map[string]any
	SubjectAttributes map[string]any
	Now               time.Time
}

// Try decides req under p with in.
func Try(ctx context.Context, p *Policy, req authzen.EvaluationRequest, in TrialInputs) (Trial, error) {
	e := &Engine{opts: Options{Attributes: staticAttributes(in.Attributes), Now: func() time.Time { return in.Now }}}
	if sa := p.SubjectAttributes; sa != nil && sa.file == nil {
		e.opts.SubjectSources = map[string]SubjectSource{sa.Source: staticSubject(in.SubjectAttributes)}
	}
	e.policy.Store(p)
	rule, _, err := e.match(ctx, p, req, in.Now)
	if err != nil || rule == nil || rule.Effect != EffectRequest {
		return Trial{Rule: rule}, err
	}
	res, err := e.Resolve(ctx, rule, req, in.Now)
	return Trial{Rule: rule, Resolver: res}, err
}

type staticAttributes map[string]any

func (s staticAttributes) Snapshot(context.Context) (map[string]any, error) {
	if s == nil {
		return map[string]any{}, nil
	}
	return s, nil
}

type staticSubject map[string]any

func (s staticSubject) SubjectAttributes(context.Context, string, string) (map[string]any, error) {
	return s, nil
}
