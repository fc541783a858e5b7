package webui

import (
	"math"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/requests"
)

// TestOutcomeWords: every terminal state and reason code the backend
// records reads as words, and no known code is shown as such.
func TestOutcomeWords(t *testing.T) {
	for _, c := range []struct{ status, reason, want string }{
		{"approved", requests.ReasonApproved, "Approved"},
		{"denied", requests.ReasonDeniedByUser, "Denied by approver"},
		{"denied", requests.ReasonDeniedByMachine, "Denied by an automated resolver"},
		{"expired", requests.ReasonTimeout, "Expired: nobody decided in time"},
		{"cancelled", requests.ReasonCancelledByPEP, "Cancelled by the requester"},
		{"cancelled", "mcp_task_cancelled", "Cancelled: the agent cancelled its task"},
		{"cancelled", "changed my mind", "Cancelled by the requester"},
		{"failed", "", "Failed"},
		{"pending", "", "Waiting for decisions"},
	} {
		require.Equal(t, c.want, outcome(c.status, c.reason), "%s/%s", c.status, c.reason)
		require.Equal(t, c.reason != "changed my mind", knownReason(c.reason), "%q", c.reason)
	}
	for _, s := range requests.AllStatuses {
		require.NotEqual(t, string(s), outcome(string(s), ""), "%s has words", s)
	}
}

func TestDurationWords(t *testing.T) {
	for d, want := range map[time.Duration]string{time.Hour: "1 hour", 30 * time.Minute: "30 minutes", 24 * time.Hour: "24 hours",
		72 * time.Hour: "3 days", 90 * time.Second: "1 min", 20 * time.Second: "20 seconds", 59*time.Minute + 30*time.Second: "59 min"} {
		require.Equal(t, want, duration(d), "%s", d)
	}
}

// luminance is the WCAG relative luminance of a #rrggbb colour.
func luminance(t *testing.T, hex string) float64 {
	t.Helper()
	require.Len(t, hex, 7, hex)
	var c [3]float64
	for i := range c {
		v, err := strconv.ParseUint(hex[1+2*i:3+2*i], 16, 8)
		require.NoError(t, err)
		x := float64(v) / 255
		if x <= 0.03928 {
			c[i] = x / 12.92
		} else {
			c[i] = math.Pow((x+0.055)/1.055, 2.4)
		}
	}
	return 0.2126*c[0] + 0.7152*c[1] + 0.0722*c[2]
}

func contrast(t *testing.T, a, b string) float64 {
	la, lb := luminance(t, a), luminance(t, b)
	return (max(la, lb) + 0.05) / (min(la, lb) + 0.05)
}

// TestControlColoursContrast: the field border and the focus indicator have
// 3:1 or more against every background a control sits on (WCAG 1.4.11
// non-text contrast), read from the stylesheet as served. The browser test
// checks the computed colours of each control on every page.
func TestControlColoursContrast(t *testing.T) {
	css, err := assetFS.ReadFile("assets/app.css")
	require.NoError(t, err)
	vars := map[string]string{}
	for _, m := range regexp.MustCompile(`--([a-z-]+):\s*(#[0-9a-fA-F]{6})`).FindAllStringSubmatch(string(css), -1) {
		vars[m[1]] = m[2]
	}
	for _, fg := range []string{"field", "focus"} {
		for _, bg := range []string{"bg", "card"} {
			require.Contains(t, vars, fg)
			require.Contains(t, vars, bg)
			c := contrast(t, vars[fg], vars[bg])
			require.GreaterOrEqual(t, c, 3.0, "--%s %s on --%s %s: %.2f:1", fg, vars[fg], bg, vars[bg], c)
		}
	}
	require.Regexp(t, `input, select, textarea \{[^}]*border: 1px solid var\(--field\)`, string(css))
	require.Regexp(t, `:focus-visible \{ outline: 3px solid var\(--focus\)`, string(css))
}

// TestApprovingShortened: the figure the page gives is the backend's own,
// shortened by the requester's requested_until or an earlier approver's
// approved_until, and says so; an approval that does not meet the quorum
// says how many are still needed.
func TestApprovingShortened(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	u := &UI{d: Deps{Now: func() time.Time { return now }}}
	r := &requests.Request{ApprovalPolicy: evaluation.ApprovalPolicy{Quorum: 2, ApprovedFor: time.Hour, MaxApprovedFor: 24 * time.Hour, GrantDelay: 30 * time.Second},
		RequestedAccess: map[string]any{"requested_until": now.Add(20 * time.Minute).Format(time.RFC3339)}}
	a := u.approving(r, nil)
	require.Equal(t, approving{Completes: false, Needed: 2, Until: now.Add(20 * time.Minute), For: 20 * time.Minute, Rule: time.Hour,
		Shortened: true, Delay: 30 * time.Second}, a)

	early := now.Add(10 * time.Minute)
	votes := []requests.Vote{{Decision: "approve", Kind: "human", ApprovedUntil: &early}}
	a = u.approving(r, votes)
	require.True(t, a.Completes)
	require.Equal(t, early, a.Until, "the most cautious approver's limit")
	require.Equal(t, r.ApprovalUntil(votes, now), a.Until, "the figure the approval will carry")
}
