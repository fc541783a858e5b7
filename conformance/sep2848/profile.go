package sep2848

import (
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Call is a tools/call: a tool and its arguments. String arguments may
// contain {nonce}, replaced by a fresh value each time a scenario uses the
// call, so runs never collide with each other's pending approvals.
type Call struct {
	Name      string         `json:"name"`
	Arguments map[string]any `json:"arguments"`
}

// Fresh returns the call with {nonce} replaced by a new random value.
func (c Call) Fresh() Call { return c.With(newNonce()) }

func newNonce() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// With returns the call with {nonce} replaced by nonce: two calls made with
// one nonce differ only where the profile wrote them differently.
func (c Call) With(nonce string) Call {
	var fill func(v any) any
	fill = func(v any) any {
		switch x := v.(type) {
		case string:
			return strings.ReplaceAll(x, "{nonce}", nonce)
		case map[string]any:
			out := make(map[string]any, len(x))
			for k, e := range x {
				out[k] = fill(e)
			}
			return out
		case []any:
			out := make([]any, len(x))
			for i, e := range x {
				out[i] = fill(e)
			}
			return out
		}
		return v
	}
	args, _ := fill(c.Arguments).(map[string]any)
	if args == nil {
		args = map[string]any{}
	}
	return Call{Name: c.Name, Arguments: args}
}

// Probe is a read-only call whose structured result shows the side effect
// of the gated call: Field changes by PerExecution each time the gated tool
// runs. It lets the suite see, from outside, whether a tool ran and how
// often.
type Probe struct {
	Call         Call    `json:"call"`
	Field        string  `json:"field"`
	PerExecution float64 `json:"per_execution"`
}

// Duration is a time.Duration written as "24h".
type Duration time.Duration

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	*d = Duration(v)
	return err
}

// Delayed is a call whose approval, once granted, cannot be used at once:
// the server's re-evaluation answers "retry" (a grant still provisioning)
// for about After.
type Delayed struct {
	Call
	After Duration `json:"after"`
}

// Stalling is a call that, once approved, runs past the server's execution
// deadline, so its outcome cannot be confirmed (outcome-unknown).
type Stalling struct {
	Call
	// For is how long the stall lasts from outside, at most.
	For Duration `json:"for"`
	// Effects is how many side effects the stalled run leaves: 0 when it
	// stalls before its effect, 1 when after. Unset, the exact count is not
	// checked.
	Effects *int `json:"effects,omitempty"`
}

// Limits are the server's per-caller limits on approval requests.
type Limits struct {
	// SubmissionsPerMinute is the rate of new approval requests one caller
	// may make.
	SubmissionsPerMinute int `json:"submissions_per_minute"`
	// MaxPending is how many approval tasks one caller may have waiting.
	MaxPending int `json:"max_pending"`
}

// Profile tells the suite which calls of the server under test produce
// which authorization outcome. Optional calls that are absent skip the
// checks that need them (reported as skipped, never as passed).
type Profile struct {
	// Gated gets a requestable denial and, once approved, runs.
	Gated Call `json:"gated"`
	// Changed is Gated with different arguments (also requestable).
	Changed Call `json:"changed"`
	// ChangedTool is another tool whose call is also requestable.
	ChangedTool *Call `json:"changed_tool,omitempty"`
	// Echoes are argument names of Gated whose values the executed tool's
	// result repeats (the run used the complete stored arguments).
	Echoes []string `json:"echoes,omitempty"`
	// Denied gets a denial that is not requestable.
	Denied *Call `json:"denied,omitempty"`
	// Failing gets a requestable denial and, once approved, runs and fails.
	Failing *Call `json:"failing,omitempty"`
	// Input needs submission input before the approval request is made.
	Input *Call `json:"input,omitempty"`
	// TaskRequired can only proceed as a task (-32003/-32021 without it).
	TaskRequired *Call `json:"task_required,omitempty"`
	// Expiring gets a requestable denial whose request expires, unresolved,
	// within ExpiresWithin.
	Expiring      *Call    `json:"expiring,omitempty"`
	ExpiresWithin Duration `json:"expires_within,omitempty"`
	// Provisioning, once approved, is retried (re-evaluation answers
	// retry) for about After, and then runs: the window in which an
	// approval has reached the server but cannot yet be used.
	Provisioning *Delayed `json:"provisioning,omitempty"`
	// Outliving, once approved, is retried until its approval expires,
	// which it does before the grant would provision (After); so does the
	// approval of every new request opened for it. It never runs.
	Outliving *Delayed `json:"outliving,omitempty"`
	// Reinput is like Outliving, and each new request it needs asks for
	// input in the task (input_required, answered with tasks/update).
	Reinput *Delayed `json:"reinput,omitempty"`
	// MaxRequests is the server's bound on the approval requests made for
	// one task (the first and every chained one).
	MaxRequests int `json:"max_requests,omitempty"`
	// Stalling, once approved, runs past the execution deadline.
	Stalling *Stalling `json:"stalling,omitempty"`
	Probe    *Probe    `json:"probe,omitempty"`
	// PendingDeadline is how long Gated's approval request may wait for a
	// decision; ResultRetention how long a terminal task stays readable.
	PendingDeadline Duration `json:"pending_deadline,omitempty"`
	ResultRetention Duration `json:"result_retention,omitempty"`
	// Limits are the per-caller limits (checked with Config.LimitsToken).
	Limits *Limits `json:"limits,omitempty"`
	// Approvers are strings that identify who decides approvals (beyond
	// what the resolver reports), which must never reach the client.
	Approvers []string `json:"approvers,omitempty"`
	// Answer fills string fields of submission input forms.
	Answer string `json:"answer,omitempty"`
}

//go:embed arap-dev.json
var arapDev []byte

// DevProfile is the profile of `arapd dev` (its demo tools and policy).
func DevProfile() Profile {
	p, err := ParseProfile(arapDev)
	if err != nil {
		panic(err)
	}
	return p
}

// ParseProfile reads a profile document.
func ParseProfile(doc []byte) (Profile, error) {
	var p Profile
	dec := json.NewDecoder(strings.NewReader(string(doc)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return p, fmt.Errorf("profile: %w", err)
	}
	if p.Gated.Name == "" || p.Changed.Name == "" {
		return p, fmt.Errorf("profile: gated and changed calls are required")
	}
	for name, d := range map[string]*Delayed{"provisioning": p.Provisioning, "outliving": p.Outliving, "reinput": p.Reinput} {
		if d != nil && (d.Name == "" || d.After <= 0) {
			return p, fmt.Errorf("profile: %s needs a name and a positive after", name)
		}
	}
	if (p.Outliving != nil || p.Reinput != nil) && p.MaxRequests <= 0 {
		return p, fmt.Errorf("profile: outliving and reinput need max_requests, the server's bound on requests per task")
	}
	if p.Stalling != nil && (p.Stalling.Name == "" || p.Stalling.For <= 0) {
		return p, fmt.Errorf("profile: stalling needs a name and a positive for")
	}
	if p.Expiring != nil && p.ExpiresWithin <= 0 {
		return p, fmt.Errorf("profile: expiring needs a positive expires_within")
	}
	if p.Limits != nil && (p.Limits.SubmissionsPerMinute <= 0 || p.Limits.MaxPending <= 0) {
		return p, fmt.Errorf("profile: limits need positive submissions_per_minute and max_pending")
	}
	if p.Answer == "" {
		p.Answer = "Needed for the SEP-2848 conformance run."
	}
	return p, nil
}
