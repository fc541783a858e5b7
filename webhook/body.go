package webhook

import (
	"encoding/json"
	"errors"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/clean"
)

// Body is what a callback POSTs: the state the PEP registered and the task
// handle. It carries no result: the PEP reads it from the status endpoint.
type Body struct {
	State string       `json:"state,omitempty"`
	Task  authzen.Task `json:"task"`
}

// ErrBody refuses a callback body that does not name a task.
var ErrBody = errors.New("webhook: the body must be a JSON object with a state and a task id, as text of at most 255 bytes")

// ParseBody decodes a verified callback's body: its state (what the PEP
// registered) and task id must be present and be text a receiver can look
// up, at most 255 bytes of valid UTF-8 without NUL.
func ParseBody(raw []byte) (Body, error) {
	var b Body
	if json.Unmarshal(raw, &b) != nil {
		return Body{}, ErrBody
	}
	for _, s := range []string{b.State, b.Task.ID} {
		if s == "" || len(s) > 255 || clean.Text(s) != nil {
			return Body{}, ErrBody
		}
	}
	return b, nil
}
