package requests

// Who may decide a request: pure functions of the voter, the request and
// its votes, shared by the web UI, the decision API, the Slack app and the
// notifications (who is asked).

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/identity"
)

// Names reports whether r's approval policy names v as a decider (whether or
// not v may decide it now), including the people of its escalation group,
// who may decide only once r has escalated.
func Names(v Voter, r *Request) bool {
	return namesDirectly(v, r) || escalationMember(v, r)
}

// namesDirectly reports whether v is a decider from the start.
func namesDirectly(v Voter, r *Request) bool {
	p := r.ApprovalPolicy
	return v.Resolver ||
		(v.human() && (slices.Contains(p.Users, v.Name) || slices.ContainsFunc(v.Groups, func(g string) bool { return slices.Contains(p.Groups, g) }))) ||
		(!v.human() && v.ClientID != "" && (slices.Contains(p.Clients, v.Name) || slices.Contains(p.Kinds, v.Kind)))
}

// escalationMember reports whether v is a person in r's escalation group.
func escalationMember(v Voter, r *Request) bool {
	g := r.ApprovalPolicy.EscalateTo
	return g != "" && v.human() && slices.Contains(v.Groups, g)
}

// Eligible says whether v may decide r, and if not, why. It checks, in order:
// the request is still open; v is one of the deciders the approval policy
// names; the request is not on v's behalf, made through v, or submitted by v.
func Eligible(v Voter, r *Request, now time.Time) error {
	if r.Status != Pending {
		return &Error{Code: authzen.ProblemInvalidTaskState, Current: r.Status, Detail: fmt.Sprintf("the request is already %s; decisions are closed", r.Status)}
	}
	if !now.Before(r.ExpiresAt) {
		return &Error{Code: authzen.ProblemInvalidTaskState, Current: Expired, Detail: fmt.Sprintf("the request expired at %s; decisions are closed", r.ExpiresAt.Format(time.RFC3339))}
	}
	return Qualified(v, r)
}

// Qualified says whether v is one of r's deciders, whatever r's state: the
// approval policy names v, and r is not on v's behalf, made through v, or
// submitted by v. Eligible is Qualified on an open request; notifications
// use it to find whom to tell.
func Qualified(v Voter, r *Request) error {
	if !Names(v, r) {
		return refuse(authzen.ProblemIneligibleApprover, "%s is not among the deciders of this request (%s)", v.ID, describeDeciders(r.ApprovalPolicy))
	}
	if !namesDirectly(v, r) && r.EscalatedAt == nil {
		p := r.ApprovalPolicy
		return refuse(authzen.ProblemIneligibleApprover, "%s may decide this request only once it escalates to group %s, %s after it was made (%s)",
			v.ID, p.EscalateTo, p.EscalateAfter, r.CreatedAt.Add(p.EscalateAfter).UTC().Format(time.RFC3339))
	}
	involved, err := r.involvedIDs()
	if err != nil {
		// Stored before chains were checked whole: nobody can be shown
		// not to be in it, so nobody decides it.
		return refuse(authzen.ProblemIneligibleApprover, "the request's actor chain cannot be read whole (%v), so nobody may decide it", err)
	}
	for _, id := range involved {
		if identity.Any(v.Identities, id) {
			return refuse(authzen.ProblemIneligibleApprover, "%s cannot decide a request made on their behalf or through them (%q)", v.ID, id)
		}
	}
	if v.ClientID != "" && v.ClientID == r.ClientID {
		return refuse(authzen.ProblemIneligibleApprover, "%s submitted this request and cannot decide it", v.ID)
	}
	if v.Via != nil {
		// The channel is held to what the client itself would be: it may
		// not carry a decision on a request it submitted or that was made
		// through it.
		via := []identity.ID{identity.Name(v.Via.Client), identity.Name(v.Via.ClientID)}
		for _, id := range involved {
			if identity.Any(via, id) {
				return refuse(authzen.ProblemIneligibleApprover, "client:%s cannot carry a decision on a request made through it (%q)", v.Via.Client, id)
			}
		}
		if v.Via.ClientID == r.ClientID {
			return refuse(authzen.ProblemIneligibleApprover, "client:%s submitted this request and cannot carry a decision on it", v.Via.Client)
		}
	}
	if !v.Resolver && r.ApprovalPolicy.RequirePasskey && v.Channel != evaluation.ChannelWeb {
		return refuse(authzen.ProblemSignatureRequired, "rule %s requires a decision signed with the approver's passkey in the web UI; %s cannot carry one",
			r.Rule, channelName(v.Channel))
	}
	if !v.Resolver && !r.ApprovalPolicy.AllowsChannel(v.Channel) {
		return refuse(authzen.ProblemChannelNotAllowed, "rule %s takes decisions only through %s, not %s", r.Rule,
			strings.Join(channelNames(r.ApprovalPolicy.Channels), " or "), channelName(v.Channel))
	}
	return nil
}

// channelName says what a channel is, for people.
func channelName(c string) string {
	switch c {
	case evaluation.ChannelWeb:
		return "the web UI (web)"
	case evaluation.ChannelAPI:
		return "an API client deciding as itself (api)"
	case evaluation.ChannelOnBehalf:
		return "an API client deciding for a person (on_behalf)"
	case evaluation.ChannelSlack:
		return "the Slack app (slack)"
	case "":
		return "an unnamed channel"
	}
	return c
}

func channelNames(cs []string) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = channelName(c)
	}
	return out
}

// MayDecide says whether v may vote on r now, and if not, why: eligibility,
// and not having voted already.
func MayDecide(v Voter, r *Request, votes []Vote, now time.Time) (bool, string) {
	if err := Eligible(v, r, now); err != nil {
		var e *Error
		if errors.As(err, &e) {
			return false, e.Detail
		}
		return false, err.Error()
	}
	for _, vt := range votes {
		if vt.Voter == v.ID {
			return false, "you have already decided this request"
		}
	}
	return true, ""
}

// Involved lists the ids a request is for or through: its subject and every
// actor in its chains.
func (r *Request) Involved() []string {
	ids, _ := r.involvedIDs()
	return ids
}

// involvedIDs lists the ids a request is for or through, each once, in
// order: the subject and every actor in subject.properties.act and
// client.actor (the same agent usually appears in both), walked by
// authzen.ActorChain as the submission's actor check walked them.
func (r *Request) involvedIDs() ([]string, error) {
	ids := []string{r.Subject.Str("id")}
	chain, err := authzen.SubjectActors(r.Subject)
	if err != nil {
		return ids, err
	}
	if r.ClientInfo != nil && r.ClientInfo.Actor != nil {
		client, err := authzen.ActorChain(r.ClientInfo.Actor, "id", "client.actor")
		if err != nil {
			return ids, err
		}
		chain = append(chain, client...)
	}
	for _, id := range chain {
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

func describeDeciders(p evaluation.ApprovalPolicy) string {
	var parts []string
	if len(p.Groups) > 0 {
		parts = append(parts, "groups "+strings.Join(p.Groups, ", "))
	}
	if len(p.Users) > 0 {
		parts = append(parts, "users "+strings.Join(p.Users, ", "))
	}
	if len(p.Clients) > 0 {
		parts = append(parts, "clients "+strings.Join(p.Clients, ", "))
	}
	if len(p.Kinds) > 0 {
		parts = append(parts, "client kinds "+strings.Join(p.Kinds, ", "))
	}
	if len(parts) == 0 {
		return "automated resolvers only"
	}
	return strings.Join(parts, "; ")
}
