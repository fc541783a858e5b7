package notify

import (
	"context"
	"encoding/json"
	"time"

	"github.com/omcp/arap/directory"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/internal/summary"
	"github.com/omcp/arap/requests"
)

// ChannelWebhook is the webhook channel's name: the operator's named
// webhook targets (an ITSM system's), which a rule lists in
// notify.webhooks. Its recipients are targets, not people.
const ChannelWebhook = evaluation.NotifyWebhook

// Poster posts a signed body to a named webhook target once: the callbacks
// machinery (callbacks.Service.PostTarget), so webhooks share its signing,
// secrets and SSRF rules.
type Poster interface {
	PostTarget(ctx context.Context, target, id string, body []byte) error
}

// Webhook is the webhook channel.
type Webhook struct{ Poster Poster }

// Name implements Channel.
func (*Webhook) Name() string { return ChannelWebhook }

// Address implements Channel: people are never reached by webhook; a
// rule's targets are added by the fan-out.
func (*Webhook) Address(*directory.User) string { return "" }

// Send posts m's payload to target m.To, under webhook-id m.ID.
func (w *Webhook) Send(ctx context.Context, m Message) error {
	return w.Poster.PostTarget(ctx, m.To, m.ID, m.Payload)
}

// Event types of the webhook payload.
const (
	TypeCreated = "request.created"
	TypeDecided = "request.decided"
	TypeEnded   = "request.ended"
)

// Payload is the body a webhook target receives, documented in
// docs/notifications.md: the event, and what the request page shows first.
// It is generic on purpose (a ServiceNow or Jira flow maps it to a ticket),
// and, like every message, it never carries a binding token, approval id or
// state, evaluation id, callback or secret.
type Payload struct {
	// ID is the event's id, the same for every target and retry; the
	// webhook-id header is ID "." target.
	ID         string         `json:"id"`
	Type       string         `json:"type"`
	OccurredAt time.Time      `json:"occurred_at"`
	Request    RequestSummary `json:"request"`
	// Decision is the vote of a request.decided event.
	Decision *Vote `json:"decision,omitempty"`
}

// RequestSummary is a request as its page shows it first.
type RequestSummary struct {
	ID string `json:"id"`
	// Status is the request's status as of the event: pending, or how it
	// ended (approved, denied, expired, cancelled, failed).
	Status string `json:"status"`
	// URL is the request's page; opening it requires signing in.
	URL string `json:"url"`
	// Rule, Title and Description come from policy.
	Rule        string `json:"rule"`
	Title       string `json:"title,omitempty"`
	Description string `json:"description,omitempty"`
	// Subject is who asks ("user alice"), Agent the agents it asks through.
	Subject   string     `json:"subject"`
	Agent     string     `json:"agent,omitempty"`
	Tool      string     `json:"tool"`
	Arguments []Argument `json:"arguments"`
	ExpiresAt time.Time  `json:"expires_at"`
	// HiddenCharacters lists invisible and look-alike characters found in
	// the fields above, as the page warns of them.
	HiddenCharacters []HiddenCharacter `json:"hidden_characters,omitempty"`
}

// Argument is one argument as the page renders it.
type Argument struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// HiddenCharacter is one kind of hidden character and where it is.
type HiddenCharacter struct {
	Code  string `json:"code"` // U+202E
	Name  string `json:"name"`
	Where string `json:"where"`
	Count int    `json:"count"`
}

// Vote is one decision.
type Vote struct {
	Voter    string `json:"voter"`
	Decision string `json:"decision"` // approve or deny
}

// payload renders event e about r for a webhook target.
func (s *Service) payload(e *event, r *requests.Request) []byte {
	sum := summary.Of(r, s.cfg.Now())
	var notes summary.Notes
	sum.Note(&notes)
	p := Payload{ID: e.ID, OccurredAt: e.CreatedAt.UTC(), Request: RequestSummary{
		ID: r.ID, Status: string(requests.Pending), URL: s.cfg.PageURL(r.ID), Rule: sum.Rule, Title: sum.Title, Description: sum.Why,
		Subject: sum.Subject, Agent: sum.Actor, Tool: sum.Tool, Arguments: []Argument{}, ExpiresAt: sum.ExpiresAt.UTC(),
	}}
	for _, a := range sum.Arguments {
		p.Request.Arguments = append(p.Request.Arguments, Argument{Name: a.Name, Value: a.Value})
	}
	for _, n := range notes.List {
		p.Request.HiddenCharacters = append(p.Request.HiddenCharacters, HiddenCharacter{Code: n.Finding.Code, Name: n.Finding.Name, Where: n.Where, Count: n.Count})
	}
	switch e.Kind {
	case requests.EventCreated:
		p.Type = TypeCreated
	case requests.EventDecided:
		p.Type = TypeDecided
		p.Decision = &Vote{Voter: e.Voter, Decision: e.Decision}
	default:
		p.Type = TypeEnded
		p.Request.Status = e.Status
	}
	body, err := json.Marshal(p)
	if err != nil {
		panic(err) // plain strings and times
	}
	return body
}
