package requests

import (
	"errors"
	"fmt"
	"time"

	"github.com/omcp/arap/authzen"
)

// Error is a refusal the caller can act on. Code is a problem code from the
// authzen package (ARAP's, or one of ours); the HTTP layer maps it to a
// status and an RFC 9457 document.
type Error struct {
	Code   string
	Detail string
	// Errors lists individual violations (schema validation).
	Errors []string
	// Current is the task's state, for invalid_task_state.
	Current Status
	// UsedAt and UsedBy are when and by which evaluation an approval was
	// used, for approval_already_used.
	UsedAt *time.Time
	UsedBy string
}

func (e *Error) Error() string { return e.Code + ": " + e.Detail }

func refuse(code, format string, args ...any) *Error {
	return &Error{Code: code, Detail: fmt.Sprintf(format, args...)}
}

// ErrorCode returns the problem code of err, or "" when err is not an *Error.
func ErrorCode(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

var errUnknownTask = &Error{Code: authzen.ProblemUnknownTask, Detail: "no access request with this id is visible to this client"}
