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

// Profile tells the suite which calls of the server under test produce
// which authorization outcome. Optional calls that are absent skip the
// checks that need them (reported as skipped, never as passed).
type Profile struct {
	// Gated gets a requestable denial and, once approved, runs.
	Gated Call `json:"gated"`
	// Changed is Gated with different arguments (also requestable).
	Changed Call `json:"changed"`
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
	// Stalling gets a requestable denial and, once approved, runs longer
	// than the server's execution deadline (outcome-unknown).
	Stalling        *Call    `json:"stalling,omitempty"`
	StallsFor       Duration `json:"stalls_for,omitempty"`
	Probe           *Probe   `json:"probe,omitempty"`
	PendingDeadline Duration `json:"pending_deadline,omitempty"`
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
	if p.Answer == "" {
		p.Answer = "Needed for the SEP-2848 conformance run."
	}
	return p, nil
}
