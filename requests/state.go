package requests

import (
	"slices"

	"github.com/omcp/arap/authzen"
)

// Status is a request's lifecycle state (ARAP section 5.1).
type Status string

// The states. A request is created pending and moves exactly once to one of
// the terminal states; terminal states never change.
const (
	Pending   Status = authzen.StatusPending
	Approved  Status = authzen.StatusApproved
	Denied    Status = authzen.StatusDenied
	Expired   Status = authzen.StatusExpired
	Cancelled Status = authzen.StatusCancelled
	Failed    Status = authzen.StatusFailed
)

// Transitions lists every allowed state change. It is the one place that says
// what may follow what; Transition refuses anything not listed.
var Transitions = map[Status][]Status{
	Pending: {Approved, Denied, Expired, Cancelled, Failed},
}

// AllStatuses lists every state.
var AllStatuses = []Status{Pending, Approved, Denied, Expired, Cancelled, Failed}

// Terminal reports whether s is final.
func (s Status) Terminal() bool { return len(Transitions[s]) == 0 }

// CanTransition reports whether from may change to to.
func CanTransition(from, to Status) bool { return slices.Contains(Transitions[from], to) }

// Reason codes recorded with a terminal state (task.display's status reason).
// A timeout is never reported as someone's denial.
const (
	ReasonTimeout         = "timeout" // expired: nobody decided in time
	ReasonCancelledByPEP  = "cancelled_by_requester"
	ReasonDeniedByUser    = "denied_by_approver"
	ReasonDeniedByMachine = "denied_by_resolver"
	ReasonApproved        = "approved"
)
