package evaluation

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/cel-go/cel"
	"go.yaml.in/yaml/v3"
)

// Decisions a resolver or approver can make.
const (
	DecisionApprove = "approve"
	DecisionDeny    = "deny"
)

// Channels are the ways a decision reaches the backend, named in a rule's
// approval.channels. Each names the path, not the decider's kind: a person
// may decide in the web UI or through a client on their behalf (and later
// through chat), so a rule can keep its decisions to one of them.
const (
	ChannelWeb      = "web"       // a person signed in to the approver web UI
	ChannelAPI      = "api"       // an API client deciding as itself (decision API)
	ChannelOnBehalf = "on_behalf" // an API client deciding for a named person (decision API, on_behalf_of)
	ChannelSlack    = "slack"     // a person pressing Approve or Deny in the Slack app's message
)

// AllChannels lists every channel, the default of approval.channels.
var AllChannels = []string{ChannelWeb, ChannelAPI, ChannelOnBehalf, ChannelSlack}

// Resolver kinds a person or API client can be (clients.Kind*).
var resolverKinds = []string{"human", "automation", "agent", "itsm"}

// ApprovalPolicy says who may decide the requests a rule makes requestable,
// and what it takes. A copy is stored with each request when it is
// submitted, so editing the policy never changes a pending request's quorum.
type ApprovalPolicy struct {
	// Quorum is the number of distinct approvals needed; any single deny
	// ends the request denied.
	Quorum int `json:"quorum"`
	// Who may decide: people in Groups or named in Users (they are human),
	// API clients named in Clients or of a kind in Kinds (automation, agent,
	// itsm), and the rule's automated resolvers.
	Groups  []string `json:"groups"`
	Users   []string `json:"users"`
	Clients []string `json:"clients"`
	Kinds   []string `json:"kinds"`
	// Channels lists the channels decisions may come through (AllChannels
	// when the rule names none, and for requests stored before channels
	// existed). The rule's automated resolvers are not a channel: they are
	// the rule itself.
	Channels []string `json:"channels,omitempty"`
	// RequireHumans is how many of the approvals must come from people.
	RequireHumans int `json:"require_humans"`
	// MachinesMay lists what non-human deciders may do: approve, deny. With
	// only "deny", automation may stop a request but only people may grant.
	MachinesMay []string `json:"machines_may"`
	// ApprovedFor is how long an approval lasts by default; MaxApprovedFor
	// caps what a decider or requested_until may ask for.
	ApprovedFor    time.Duration `json:"approved_for"`
	MaxApprovedFor time.Duration `json:"max_approved_for"`
	// GrantDelay keeps a fresh approval in "grant_pending" this long, as if
	// provisioning took time (re-evaluation answers retry).
	GrantDelay time.Duration `json:"grant_delay,omitempty"`
	// Automated is true when the rule has automated resolvers.
	Automated bool `json:"automated,omitempty"`
	// RemindEvery, when set, records a reminder for the deciders who have
	// not voted every RemindEvery while the request is pending.
	RemindEvery time.Duration `json:"remind_every,omitempty"`
	// EscalateAfter, when set, adds the people of group EscalateTo to the
	// deciders once the request has waited this long (and tells them).
	EscalateAfter time.Duration `json:"escalate_after,omitempty"`
	EscalateTo    string        `json:"escalate_to,omitempty"`
	// DeclaredContext lists the context members the rule asks for (the
	// properties its request_schema gives context) or binds (context_members).
	// Any other member is the requester's extra: shown to people folded away
	// as not asked for and not checked, and never seen by automated resolvers
	// (context is an ARAP extension point, so such members are kept, not
	// refused).
	DeclaredContext []string `json:"declared_context,omitempty"`
	// RequirePasskey: every person's decision must be signed with their
	// registered passkey (package passkeys), in the web UI; other channels
	// cannot carry a signature and are refused.
	RequirePasskey bool `json:"require_passkey,omitempty"`
	// Notify is the rule's notify section (nil without one). It lives here
	// because this is what is stored with each request.
	Notify *NotifyPolicy `json:"notify,omitempty"`
}

// AllowsChannel reports whether decisions may come through channel: one
// the rule lists, and only the web UI when decisions must be signed with a
// passkey (no other channel can carry a signature).
func (a ApprovalPolicy) AllowsChannel(channel string) bool {
	if a.RequirePasskey && channel != ChannelWeb {
		return false
	}
	return len(a.Channels) == 0 || slices.Contains(a.Channels, channel)
}

// MachinesMayApprove reports whether non-human deciders may approve.
func (a ApprovalPolicy) MachinesMayApprove() bool {
	return slices.Contains(a.MachinesMay, DecisionApprove)
}

// Resolver is an automated decider: the first of a rule's resolvers whose
// condition holds decides.
type Resolver struct {
	Name     string
	When     Expr
	Decision string
	Reason   string
	program  cel.Program
}

type approvalSpec struct {
	Quorum         int            `yaml:"quorum"`
	Groups         []string       `yaml:"groups"`
	Users          []string       `yaml:"users"`
	Clients        []string       `yaml:"clients"`
	Kinds          []string       `yaml:"kinds"`
	Channels       lines          `yaml:"channels"`
	RequireHumans  int            `yaml:"require_humans"`
	MachinesMay    []string       `yaml:"machines_may"`
	ApprovedFor    Duration       `yaml:"approved_for"`
	MaxApprovedFor Duration       `yaml:"max_approved_for"`
	GrantDelay     Duration       `yaml:"grant_delay"`
	Resolvers      []resolverSpec `yaml:"resolvers"`
	RemindEvery    Duration       `yaml:"remind_every"`
	EscalateAfter  Duration       `yaml:"escalate_after"`
	EscalateTo     lineString     `yaml:"escalate_to"`
	RequirePasskey bool           `yaml:"require_passkey"`
	Line           int            `yaml:"-"`
}

var approvalKeys = []string{"quorum", "groups", "users", "clients", "kinds", "channels", "require_humans", "machines_may",
	"approved_for", "max_approved_for", "grant_delay", "resolvers", "remind_every", "escalate_after", "escalate_to", "require_passkey"}

// MinRemindEvery is the shortest reminder interval: reminders go to people,
// and more often than this would be noise, not a nudge.
const MinRemindEvery = time.Minute

func (a *approvalSpec) UnmarshalYAML(n *yaml.Node) error {
	if err := checkKeys(n, approvalKeys, "approval"); err != nil {
		return err
	}
	type plain approvalSpec
	var p plain
	if err := n.Decode(&p); err != nil {
		return err
	}
	*a = approvalSpec(p)
	a.Line = n.Line
	return nil
}

// lines is a list of strings that keeps each one's line, for errors.
type lines []lineString

type lineString struct {
	Value string
	Line  int
}

func (l *lineString) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: expected a string", n.Line)
	}
	*l = lineString{Value: n.Value, Line: n.Line}
	return nil
}

type resolverSpec struct {
	Name     string `yaml:"name"`
	When     Expr   `yaml:"when"`
	Decision string `yaml:"decision"`
	Reason   string `yaml:"reason"`
	Line     int    `yaml:"-"`
}

func (r *resolverSpec) UnmarshalYAML(n *yaml.Node) error {
	if err := checkKeys(n, []string{"name", "when", "decision", "reason"}, "resolver"); err != nil {
		return err
	}
	type plain resolverSpec
	var p plain
	if err := n.Decode(&p); err != nil {
		return err
	}
	*r = resolverSpec(p)
	r.Line = n.Line
	return nil
}

func compileApproval(env *cel.Env, s approvalSpec, add func(line int, format string, args ...any)) (ApprovalPolicy, []*Resolver) {
	a := ApprovalPolicy{
		Quorum: s.Quorum, Groups: s.Groups, Users: s.Users, Clients: s.Clients, Kinds: s.Kinds,
		RequireHumans: s.RequireHumans, MachinesMay: s.MachinesMay,
		ApprovedFor: s.ApprovedFor.Duration, MaxApprovedFor: s.MaxApprovedFor.Duration, GrantDelay: s.GrantDelay.Duration,
	}
	if a.Quorum == 0 {
		a.Quorum = 1
	}
	if a.Quorum < 0 || a.Quorum > 20 {
		add(s.Line, "approval.quorum must be between 1 and 20")
	}
	if a.RequireHumans < 0 || a.RequireHumans > a.Quorum {
		add(s.Line, "approval.require_humans must be between 0 and the quorum (%d)", a.Quorum)
	}
	for _, k := range a.Kinds {
		if !slices.Contains(resolverKinds, k) || k == "human" {
			add(s.Line, "approval.kinds: %q is not an API client kind (automation, agent, itsm); people are named by groups and users", k)
		}
	}
	for _, c := range s.Channels {
		if !slices.Contains(AllChannels, c.Value) {
			add(c.Line, "approval.channels: unknown channel %q (known: %s)", c.Value, strings.Join(AllChannels, ", "))
		} else if slices.Contains(a.Channels, c.Value) {
			add(c.Line, "approval.channels: %q is listed twice", c.Value)
		} else {
			a.Channels = append(a.Channels, c.Value)
		}
	}
	if s.Channels != nil && len(s.Channels) == 0 {
		add(s.Line, "approval.channels is empty, so nobody could decide; leave it out to allow every channel")
	}
	if a.MachinesMay == nil {
		a.MachinesMay = []string{DecisionApprove, DecisionDeny}
	}
	for _, m := range a.MachinesMay {
		if m != DecisionApprove && m != DecisionDeny {
			add(s.Line, "approval.machines_may: %q is not approve or deny", m)
		}
	}
	if a.ApprovedFor == 0 {
		a.ApprovedFor = time.Hour
	}
	if a.MaxApprovedFor == 0 {
		a.MaxApprovedFor = 24 * time.Hour
	}
	if a.ApprovedFor > a.MaxApprovedFor {
		add(s.Line, "approval.approved_for (%s) exceeds max_approved_for (%s)", a.ApprovedFor, a.MaxApprovedFor)
	}
	a.RemindEvery, a.EscalateAfter, a.EscalateTo = s.RemindEvery.Duration, s.EscalateAfter.Duration, s.EscalateTo.Value
	a.RequirePasskey = s.RequirePasskey
	if a.RequirePasskey && len(a.Groups)+len(a.Users) == 0 {
		add(s.Line, "approval.require_passkey: only people sign with passkeys, and the rule names none (groups or users)")
	}
	if a.RequirePasskey && len(a.Channels) > 0 && !slices.Contains(a.Channels, ChannelWeb) {
		add(s.Line, "approval.require_passkey: signed decisions are made in the web UI, which approval.channels leaves out")
	}
	if a.RemindEvery != 0 && a.RemindEvery < MinRemindEvery {
		add(s.RemindEvery.Line, "approval.remind_every (%s) is shorter than %s", a.RemindEvery, MinRemindEvery)
	}
	switch {
	case a.EscalateAfter != 0 && a.EscalateTo == "":
		add(s.EscalateAfter.Line, "approval.escalate_after needs escalate_to, the group whose people become deciders")
	case a.EscalateAfter == 0 && a.EscalateTo != "":
		add(s.EscalateTo.Line, "approval.escalate_to needs escalate_after, how long the request waits before escalating")
	case a.EscalateTo != "" && slices.Contains(a.Groups, a.EscalateTo):
		add(s.EscalateTo.Line, "approval.escalate_to: group %q already decides (approval.groups), so escalating to it changes nothing", a.EscalateTo)
	}
	if len(a.Groups)+len(a.Users)+len(a.Clients)+len(a.Kinds)+len(s.Resolvers) == 0 {
		add(s.Line, "approval names no one who may decide (groups, users, clients, kinds or resolvers)")
	}
	var resolvers []*Resolver
	names := map[string]bool{}
	for _, rs := range s.Resolvers {
		r := &Resolver{Name: rs.Name, When: rs.When, Decision: rs.Decision, Reason: rs.Reason}
		if !nameRE.MatchString(r.Name) || names[r.Name] {
			add(rs.Line, "resolver name %q must be a unique lower_snake_case name", r.Name)
		}
		names[r.Name] = true
		if r.Decision != DecisionApprove && r.Decision != DecisionDeny {
			add(rs.Line, "resolver %q: decision must be approve or deny", r.Name)
		}
		if r.Decision == DecisionApprove && !a.MachinesMayApprove() {
			add(rs.Line, "resolver %q approves, but machines_may does not allow machines to approve", r.Name)
		}
		if r.When.Src == "" {
			add(rs.Line, "resolver %q: when is required", r.Name)
		} else if prg, err := compileCondition(env, r.When.Src); err != nil {
			add(r.When.Line, "resolver %q: when: %v", r.Name, err)
		} else {
			r.program = prg
		}
		resolvers = append(resolvers, r)
	}
	a.Automated = len(resolvers) > 0
	return a, resolvers
}

// compileCondition compiles a bool CEL expression.
func compileCondition(env *cel.Env, src string) (cel.Program, error) {
	ast, iss := env.Compile(src)
	if iss != nil && iss.Err() != nil {
		return nil, fmt.Errorf("%s", oneLine(iss.Err().Error()))
	}
	if ast.OutputType() != cel.BoolType && ast.OutputType() != cel.DynType {
		return nil, fmt.Errorf("must be a bool expression, is %s", ast.OutputType())
	}
	return env.Program(ast, cel.CostLimit(celCostLimit), cel.EvalOptions(cel.OptOptimize))
}
