package tasks

import (
	"encoding/json"
	"slices"
	"time"
)

// Status is a task's status.
type Status string

// Task statuses. working and input_required alternate; the other three are
// terminal and never change.
const (
	Working       Status = "working"
	InputRequired Status = "input_required"
	Completed     Status = "completed"
	Failed        Status = "failed"
	Cancelled     Status = "cancelled"
)

// Transitions lists every allowed status change.
var Transitions = map[Status][]Status{
	Working:       {InputRequired, Completed, Failed, Cancelled},
	InputRequired: {Working, Completed, Failed, Cancelled},
}

// AllStatuses lists every status.
var AllStatuses = []Status{Working, InputRequired, Completed, Failed, Cancelled}

// Terminal reports whether s is final.
func (s Status) Terminal() bool { return len(Transitions[s]) == 0 }

// CanTransition reports whether from may change to to.
func CanTransition(from, to Status) bool { return slices.Contains(Transitions[from], to) }

// Error is a JSON-RPC error object, as a failed task carries it.
type Error struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// Task is a stored task.
type Task struct {
	ID        string
	Principal string // who may see, update and cancel it
	Kind      string // which Kind handles it
	Status    Status
	// StatusMessage goes to the client and its model: it must be sanitized
	// (fixed text, never untrusted input).
	StatusMessage string
	// InputRequests are the outstanding requests while input_required.
	InputRequests map[string]any
	// AnsweredKeys are input keys already answered; never reused.
	AnsweredKeys []string
	Result       json.RawMessage // completed: the CallToolResult
	Error        *Error          // failed
	// Meta is added to the task's _meta while it is in this state (for
	// example a SEP-2643 envelope while non-terminal).
	Meta           map[string]any
	CreatedAt      time.Time
	UpdatedAt      time.Time
	TTLMs          *int64 // nil: unlimited
	PollIntervalMs int
	TerminalAt     *time.Time
}

// Wire is the flat Task shape (SEP-2663).
type Wire struct {
	TaskID         string `json:"taskId"`
	Status         Status `json:"status"`
	StatusMessage  string `json:"statusMessage,omitempty"`
	CreatedAt      string `json:"createdAt"`
	LastUpdatedAt  string `json:"lastUpdatedAt"`
	TTLMs          *int64 `json:"ttlMs"` // present even when null
	PollIntervalMs int    `json:"pollIntervalMs,omitempty"`
}

// Detailed is a DetailedTask: Wire plus what the status carries.
type Detailed struct {
	Wire
	InputRequests map[string]any  `json:"inputRequests,omitempty"`
	Result        json.RawMessage `json:"result,omitempty"`
	Error         *Error          `json:"error,omitempty"`
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// Wire renders the task's flat fields.
func (t *Task) Wire() Wire {
	return Wire{TaskID: t.ID, Status: t.Status, StatusMessage: t.StatusMessage, CreatedAt: stamp(t.CreatedAt),
		LastUpdatedAt: stamp(t.UpdatedAt), TTLMs: t.TTLMs, PollIntervalMs: t.PollIntervalMs}
}

// Detailed renders the task as tasks/get and notifications/tasks show it.
func (t *Task) Detailed() Detailed {
	d := Detailed{Wire: t.Wire()}
	switch t.Status {
	case InputRequired:
		d.InputRequests = t.InputRequests
		if d.InputRequests == nil {
			d.InputRequests = map[string]any{}
		}
	case Completed:
		d.Result = t.Result
	case Failed:
		d.Error = t.Error
	}
	return d
}
