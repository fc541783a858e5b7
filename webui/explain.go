package webui

import (
	"strconv"
	"strings"
	"time"

	"github.com/omcp/arap/requests"
)

// The helpers here put requests in words for approvers: what approving
// does, the arguments that identify a request in a list, and outcomes. They
// are registered beside the other template functions.
func init() {
	funcs["outcome"] = outcome
	funcs["keyArgs"] = keyArgs
	funcs["knownReason"] = knownReason
	funcs["duration"] = duration
}

// outcome is a request's state in words, from its status and reason code. A
// reason the backend does not know (a requester's own cancellation reason)
// is the caller's text, shown as such.
func outcome(status, reason string) string {
	switch requests.Status(status) {
	case requests.Pending:
		return "Waiting for decisions"
	case requests.Approved:
		return "Approved"
	case requests.Denied:
		if reason == requests.ReasonDeniedByMachine {
			return "Denied by an automated resolver"
		}
		return "Denied by approver"
	case requests.Expired:
		return "Expired: nobody decided in time"
	case requests.Cancelled:
		if reason == "mcp_task_cancelled" { // what arapd mcp sends when the agent cancels its task
			return "Cancelled: the agent cancelled its task"
		}
		return "Cancelled by the requester"
	case requests.Failed:
		return "Failed"
	}
	return status
}

// knownReason reports whether outcome already says what reason means, so
// that the code itself need not be shown.
func knownReason(reason string) bool {
	switch reason {
	case "", requests.ReasonApproved, requests.ReasonDeniedByUser, requests.ReasonDeniedByMachine, requests.ReasonTimeout,
		requests.ReasonCancelledByPEP, "mcp_task_cancelled":
		return true
	}
	return false
}

// Key arguments are what a list row shows of a call: the first few
// arguments, each value on one line and cut short; the request page shows
// them all. The row's badge still flags a hidden character beyond a cut.
const (
	keyArgsShown = 3
	keyArgRunes  = 48
)

// keyArgList is a row's arguments and how many more there are.
type keyArgList struct {
	Fields []keyArg
	More   int
}

// keyArg is one key argument; Clipped says its value was cut short. The
// template writes the ellipsis (&hellip;) after the value, outside show:
// U+2026 is a compatibility character, and in the value it would be marked
// as if the requester had written it.
type keyArg struct {
	Field
	Clipped bool
}

func keyArgs(args []Field) keyArgList {
	var out keyArgList
	for i, f := range args {
		if i == keyArgsShown {
			out.More = len(args) - i
			break
		}
		v := f.Value
		if f.Multiline {
			v = strings.Join(strings.Fields(v), " ") // indented JSON on one line
		}
		clipped := false
		if r := []rune(v); len(r) > keyArgRunes {
			v, clipped = string(r[:keyArgRunes-1]), true
		}
		out.Fields = append(out.Fields, keyArg{Field: Field{Name: f.Name, Value: v}, Clipped: clipped})
	}
	return out
}

// approving says, before anyone approves, what approving does: whether this
// approval completes the quorum, when the call runs, and until when the
// approval will be valid, with the figure the backend will give it
// (requests.Request.ApprovalUntil) rather than a guess.
type approving struct {
	Completes bool          // this approval meets the quorum
	Needed    int           // approvals still needed, this one included
	Until     time.Time     // approved_until if the approval were issued now
	For       time.Duration // Until - now
	Rule      time.Duration // the rule's approved_for
	Shortened bool          // shorter than the rule's: the requester or an earlier approver asked for less
	Delay     time.Duration // the rule's grant_delay
}

func (u *UI) approving(r *requests.Request, votes []requests.Vote) approving {
	approvals, humans := 0, 0
	for _, vt := range votes {
		if vt.Decision == "approve" {
			approvals++
			if vt.Kind == "human" {
				humans++
			}
		}
	}
	p := r.ApprovalPolicy
	now := u.now()
	until := r.ApprovalUntil(votes, now)
	return approving{
		// The web UI's voter is a person.
		Completes: approvals+1 >= p.Quorum && humans+1 >= p.RequireHumans,
		Needed:    max(p.Quorum-approvals, p.RequireHumans-humans, 1),
		Until:     until, For: until.Sub(now.Truncate(time.Second)), Rule: p.ApprovedFor,
		Shortened: until.Before(now.Truncate(time.Second).Add(p.ApprovedFor)), Delay: p.GrantDelay,
	}
}

// duration is d in words: "1 hour", "90 minutes", "2 days".
func duration(d time.Duration) string {
	plural := func(n int, unit string) string {
		if n == 1 {
			return "1 " + unit
		}
		return strconv.Itoa(n) + " " + unit + "s"
	}
	switch {
	case d >= 48*time.Hour && d%(24*time.Hour) == 0:
		return plural(int(d/(24*time.Hour)), "day")
	case d >= time.Hour && d%time.Hour == 0:
		return plural(int(d/time.Hour), "hour")
	case d >= time.Minute && d%time.Minute == 0:
		return plural(int(d/time.Minute), "minute")
	case d >= time.Minute:
		return humanize(d)
	default:
		return plural(int((d+time.Second-1)/time.Second), "second")
	}
}
