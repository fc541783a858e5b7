package evaluation

import (
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Notification channels, named in a rule's notify.channels: how the people
// and systems the rule names are told of its requests. (Not the decision
// channels of approval.channels: those say how a decision may arrive.)
const (
	NotifyEmail   = "email"   // the deciders and the requester, at their directory addresses
	NotifySlack   = "slack"   // the same people, in Slack, found by their directory addresses
	NotifyWebhook = "webhook" // the operator's named webhook targets in notify.webhooks (ITSM)
)

// NotifyChannels lists every notification channel.
var NotifyChannels = []string{NotifyEmail, NotifySlack, NotifyWebhook}

// WebhookNameRE is what a webhook target's name looks like.
var WebhookNameRE = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)

// NotifyPolicy says whom a rule's requests are told about, and how. A copy
// is stored with each request inside its ApprovalPolicy, so notify reads it
// from the request and editing the policy never changes a pending request's
// notifications. A rule without a notify section has none (nil): e-mail to
// the people, as before notify sections existed.
type NotifyPolicy struct {
	// Channels lists the channels used; every person channel when nil. An
	// empty list (no channel) is stored as [], not left out: read back as
	// nil it would mean every channel.
	Channels []string `json:"channels"`
	// Webhooks names the operator's webhook targets told of each event
	// (arapctl webhooks create); set exactly when Channels has "webhook".
	Webhooks []string `json:"webhooks,omitempty"`
	// Reminders and escalation (remind_every, escalate_after with its
	// group) belong here, parsed by notifySpec below.
}

// Uses reports whether channel is used; without a list, every channel
// that reaches people (e-mail, Slack: whichever the backend has) is.
func (n *NotifyPolicy) Uses(channel string) bool {
	if n == nil || n.Channels == nil {
		return channel != NotifyWebhook
	}
	return slices.Contains(n.Channels, channel)
}

// notifySpec is a rule's notify section as written. Add remind_every and
// escalate_after here (and to notifyKeys), compiled in compileNotify.
type notifySpec struct {
	Channels lines `yaml:"channels"`
	Webhooks lines `yaml:"webhooks"`
	Line     int   `yaml:"-"`
}

var notifyKeys = []string{"channels", "webhooks"}

func (s *notifySpec) UnmarshalYAML(n *yaml.Node) error {
	if err := checkKeys(n, notifyKeys, "notify"); err != nil {
		return err
	}
	type plain notifySpec
	var p plain
	if err := n.Decode(&p); err != nil {
		return err
	}
	*s = notifySpec(p)
	s.Line = n.Line
	return nil
}

func compileNotify(s *notifySpec, add func(line int, format string, args ...any)) *NotifyPolicy {
	if s == nil {
		return nil
	}
	n := &NotifyPolicy{}
	if s.Channels != nil {
		n.Channels = []string{} // listed, even empty: exactly these
	}
	for _, c := range s.Channels {
		switch {
		case !slices.Contains(NotifyChannels, c.Value):
			add(c.Line, "notify.channels: unknown channel %q (known: %s)", c.Value, strings.Join(NotifyChannels, ", "))
		case slices.Contains(n.Channels, c.Value):
			add(c.Line, "notify.channels: %q is listed twice", c.Value)
		default:
			n.Channels = append(n.Channels, c.Value)
		}
	}
	for _, w := range s.Webhooks {
		switch {
		case !WebhookNameRE.MatchString(w.Value):
			add(w.Line, "notify.webhooks: %q is not a webhook target name (lower case letters, digits, - and _)", w.Value)
		case slices.Contains(n.Webhooks, w.Value):
			add(w.Line, "notify.webhooks: %q is listed twice", w.Value)
		default:
			n.Webhooks = append(n.Webhooks, w.Value)
		}
	}
	if wants := slices.Contains(n.Channels, NotifyWebhook); wants && len(s.Webhooks) == 0 {
		add(s.Line, "notify.channels has webhook, but notify.webhooks names no target")
	} else if !wants && len(s.Webhooks) > 0 {
		add(s.Line, "notify.webhooks names targets, but notify.channels does not have webhook")
	}
	return n
}
