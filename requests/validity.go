package requests

import (
	"time"

	"github.com/omcp/arap/evaluation"
)

// ApprovalUntil is the approved_until an approval of r issued at now with
// votes would carry: the rule's approved_for, shortened by the most cautious
// approver's approved_until and by the requester's requested_until, capped
// by max_approved_for. The approval uses it, and the web UI shows it before
// anyone approves, so the two never differ.
func (r *Request) ApprovalUntil(votes []Vote, now time.Time) time.Time {
	p := r.ApprovalPolicy
	now = now.Truncate(time.Second) // approvals speak in RFC 3339 seconds
	until := now.Add(p.ApprovedFor)
	asked := false
	for _, vt := range votes {
		if vt.Decision == evaluation.DecisionApprove && vt.ApprovedUntil != nil && (!asked || vt.ApprovedUntil.Before(until)) {
			until, asked = *vt.ApprovedUntil, true // the most cautious approver wins
		}
	}
	if s, ok := r.RequestedAccess["requested_until"].(string); ok {
		if t, err := time.Parse(time.RFC3339, s); err == nil && t.After(now) && t.Before(until) {
			until = t // never more than the requester asked for
		}
	}
	if max := now.Add(p.MaxApprovedFor); until.After(max) {
		until = max
	}
	return until.Truncate(time.Second)
}
