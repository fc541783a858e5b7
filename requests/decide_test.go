package requests_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/identity"
	"github.com/omcp/arap/requests"
)

var (
	bob   = requests.UserVoter("bob", names("bob", "bob@example.com"), []string{"treasury"})
	carol = requests.UserVoter("carol", names("carol"), []string{"treasury"})
	dave  = requests.UserVoter("dave", names("dave"), []string{"platform"})
	erin  = requests.UserVoter("erin", names("erin"), []string{"platform"})
	alice = requests.UserVoter("alice", names("alice", "alice@example.com"), []string{"treasury"})
)

func names(ss ...string) []identity.ID {
	var out []identity.ID
	for _, s := range ss {
		out = append(out, identity.Name(s))
	}
	return out
}

func (f *fixture) clientVoter(name, kind string) requests.Voter {
	c, _, err := clients.NewStore(f.db).Create(context.Background(), clients.New{Name: name, Scopes: []string{"decide"}, Kind: kind}, "test")
	require.NoError(f.t, err)
	return requests.ClientVoter(c.ID, c.Name, c.Kind)
}

// submitFor submits a request for tool on behalf of subject (through agent:demo).
func (f *fixture) submitFor(subject, tool string, args map[string]any) *requests.Request {
	f.t.Helper()
	req := toolCall(tool, args)
	req.Subject["id"] = subject
	d, hint := f.deny(f.pep, req)
	res, err := f.svc.Submit(context.Background(), f.pep, "", mustJSON(f.t, submission(req, d, hint)))
	require.NoError(f.t, err)
	return res.Request
}

func TestEligibility(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	ctx := context.Background()
	wire := map[string]any{"to": "acct-991", "amount": 50000}
	pepVoter := requests.ClientVoter(f.pep.ID, "pep", "itsm")
	cases := []struct {
		name    string
		subject string
		voter   requests.Voter
		detail  string
	}{
		{"the subject approving their own request", "alice", alice, `on their behalf or through them ("alice")`},
		{"matched by email, case-insensitively", "BOB@example.com", bob, "on their behalf"},
		{"the actor the request was made through", "alice", requests.UserVoter("agent:demo", names("agent:demo"), []string{"treasury"}), `("agent:demo")`},
		{"the client that submitted it", "alice", pepVoter, "submitted this request"},
		{"someone outside the approver groups", "alice", dave, "not among the deciders"},
		{"a client kind the rule does not name", "alice", requests.ClientVoter("cli_x", "x", "agent"), "not among the deciders"},
		{"the subject through a client on their behalf", "alice", requests.OnBehalf(alice, "cli_bot", "bot", "itsm"), `on their behalf or through them ("alice")`},
		{"an eligible person through the client that submitted it", "alice", requests.OnBehalf(bob, f.pep.ID, "pep", "itsm"), "client:pep submitted this request"},
		{"an eligible person through the actor the request was made through", "alice", requests.OnBehalf(bob, "cli_agent", "agent:demo", "agent"), `client:agent:demo cannot carry a decision on a request made through it ("agent:demo")`},
		{"a person outside the approver groups through a client", "alice", requests.OnBehalf(dave, "cli_bot", "bot", "itsm"), "user:dave is not among the deciders"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := f.submitFor(tc.subject, "wire_transfer", wire)
			_, err := f.svc.Decide(ctx, tc.voter, r.ID, requests.Decision{Approve: true})
			require.Equal(t, authzen.ProblemIneligibleApprover, requests.ErrorCode(err), "%v", err)
			require.Contains(t, err.Error(), tc.detail)
			got, err := f.svc.Load(ctx, r.ID)
			require.NoError(t, err)
			require.Equal(t, requests.Pending, got.Status)
			votes, err := f.svc.Votes(ctx, r.ID)
			require.NoError(t, err)
			require.Empty(t, votes, "an ineligible vote is not recorded")
		})
	}
	// An eligible approver succeeds on the same kind of request.
	r := f.submitFor("alice", "wire_transfer", wire)
	got, err := f.svc.Decide(ctx, bob, r.ID, requests.Decision{Approve: true, Reason: "checked the invoice"})
	require.NoError(t, err)
	require.Equal(t, requests.Approved, got.Status)
	votes, err := f.svc.Votes(ctx, r.ID)
	require.NoError(t, err)
	require.Len(t, votes, 1)
	require.Equal(t, "user:bob", votes[0].Voter)
	require.Equal(t, "human", votes[0].Kind)
	require.Equal(t, "checked the invoice", votes[0].Reason)
	require.False(t, votes[0].At.IsZero())
}

func TestTwoOfTwoNeedsTwoDistinctApprovers(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	ctx := context.Background()
	r := f.submitFor("alice", "delete_repository", map[string]any{"repo": "payments"})

	got, err := f.svc.Decide(ctx, dave, r.ID, requests.Decision{Approve: true})
	require.NoError(t, err)
	require.Equal(t, requests.Pending, got.Status, "one approval of two is not enough")
	_, err = f.svc.Decide(ctx, dave, r.ID, requests.Decision{Approve: true})
	require.Equal(t, authzen.ProblemAlreadyDecided, requests.ErrorCode(err), "one vote per approver")

	// Automation may deny here, but may not grant.
	robot := f.clientVoter("robot", "automation")
	_, err = f.svc.Decide(ctx, robot, r.ID, requests.Decision{Approve: true})
	require.Equal(t, authzen.ProblemIneligibleApprover, requests.ErrorCode(err))
	require.Contains(t, err.Error(), "only a person may approve")

	got, err = f.svc.Decide(ctx, erin, r.ID, requests.Decision{Approve: true})
	require.NoError(t, err)
	require.Equal(t, requests.Approved, got.Status)
	require.NotNil(t, got.Result)
	require.Equal(t, "reevaluate", got.Result.Mode)
	a := got.Result.Approval
	require.NotEmpty(t, a.ID)
	require.NotEmpty(t, a.State)
	require.WithinDuration(t, f.clock.Now().Add(time.Hour), a.ApprovedUntil, 2*time.Second, "approved_for defaults to 1h")

	_, err = f.svc.Decide(ctx, robot, r.ID, requests.Decision{Approve: false})
	require.Equal(t, authzen.ProblemInvalidTaskState, requests.ErrorCode(err), "no votes after a terminal state")
}

func TestDenyAfterApproveEndsDenied(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	ctx := context.Background()
	r := f.submitFor("alice", "delete_repository", map[string]any{"repo": "payments"})
	_, err := f.svc.Decide(ctx, dave, r.ID, requests.Decision{Approve: true})
	require.NoError(t, err)
	got, err := f.svc.Decide(ctx, erin, r.ID, requests.Decision{Approve: false, Reason: "still in use"})
	require.NoError(t, err)
	require.Equal(t, requests.Denied, got.Status)
	require.Equal(t, requests.ReasonDeniedByUser, got.StatusReason)
	require.Nil(t, got.Result)

	// A machine's deny is reported as a machine's.
	r = f.submitFor("alice", "delete_repository", map[string]any{"repo": "ledger"})
	got, err = f.svc.Decide(ctx, f.clientVoter("scanner", "automation"), r.ID, requests.Decision{Approve: false, Reason: "risk high"})
	require.NoError(t, err)
	require.Equal(t, requests.Denied, got.Status)
	require.Equal(t, requests.ReasonDeniedByMachine, got.StatusReason)
}

func TestVoteAfterExpiryIsRefused(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	ctx := context.Background()
	r := f.submitFor("alice", "wire_transfer", map[string]any{"amount": 50000})
	f.clock.Advance(24*time.Hour + time.Second)
	_, err := f.svc.Decide(ctx, bob, r.ID, requests.Decision{Approve: true})
	require.Equal(t, authzen.ProblemInvalidTaskState, requests.ErrorCode(err))
	require.Contains(t, err.Error(), "expired")
	got, err := f.svc.Get(ctx, f.pep, r.ID)
	require.NoError(t, err)
	require.Equal(t, requests.Expired, got.Status)
	require.Equal(t, requests.ReasonTimeout, got.StatusReason)
}

func TestApprovedUntil(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	ctx := context.Background()
	now := f.clock.Now()

	r := f.submitFor("alice", "wire_transfer", map[string]any{"amount": 50000})
	tooLate := now.Add(9 * time.Hour)
	_, err := f.svc.Decide(ctx, bob, r.ID, requests.Decision{Approve: true, ApprovedUntil: &tooLate})
	require.Equal(t, authzen.ProblemInvalidRequest, requests.ErrorCode(err))
	require.Contains(t, err.Error(), "at most 8h0m0s")
	fine := now.Add(3 * time.Hour)
	got, err := f.svc.Decide(ctx, bob, r.ID, requests.Decision{Approve: true, ApprovedUntil: &fine})
	require.NoError(t, err)
	require.WithinDuration(t, fine, got.Result.Approval.ApprovedUntil, time.Second)

	// requested_until shorter than the default wins: never more than asked.
	req := toolCall("wire_transfer", map[string]any{"amount": 60000})
	d, hint := f.deny(f.pep, req)
	body := submission(req, d, hint)
	asked := now.Add(20 * time.Minute).UTC().Truncate(time.Second)
	body["requested_access"] = map[string]any{"requested_until": asked.Format(time.RFC3339)}
	res, err := f.svc.Submit(ctx, f.pep, "", mustJSON(t, body))
	require.NoError(t, err)
	got, err = f.svc.Decide(ctx, carol, res.Request.ID, requests.Decision{Approve: true})
	require.NoError(t, err)
	require.Equal(t, asked, got.Result.Approval.ApprovedUntil.UTC())
}

// TestApproveCancelRace runs an approval and a cancellation of the same
// request at once, many times: exactly one wins, and the state never changes
// after.
func TestApproveCancelRace(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	ctx := context.Background()
	outcomes := map[requests.Status]int{}
	for i := range 60 {
		r := f.submitFor("alice", "wire_transfer", map[string]any{"amount": 50000 + i})
		var wg sync.WaitGroup
		var approveErr, cancelErr error
		start := make(chan struct{})
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			_, approveErr = f.svc.Decide(ctx, bob, r.ID, requests.Decision{Approve: true})
		}()
		go func() { defer wg.Done(); <-start; _, cancelErr = f.svc.Cancel(ctx, f.pep, r.ID, "", "") }()
		close(start)
		wg.Wait()
		got, err := f.svc.Load(ctx, r.ID)
		require.NoError(t, err)
		outcomes[got.Status]++
		switch got.Status {
		case requests.Approved:
			require.NoError(t, approveErr)
			require.Equal(t, authzen.ProblemInvalidTaskState, requests.ErrorCode(cancelErr))
		case requests.Cancelled:
			require.NoError(t, cancelErr)
			require.Equal(t, authzen.ProblemInvalidTaskState, requests.ErrorCode(approveErr))
		default:
			t.Fatalf("request ended %s", got.Status)
		}
		events, err := audit.Chain(ctx, f.db, r.ID)
		require.NoError(t, err)
		terminal := 0
		for _, e := range events {
			if e.Kind == "request.approved" || e.Kind == "request.cancelled" {
				terminal++
			}
		}
		require.Equal(t, 1, terminal, "exactly one terminal transition")
	}
	t.Logf("outcomes over 60 races: %v", outcomes)
}

func TestRevoke(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	ctx := context.Background()
	r := f.submitFor("alice", "wire_transfer", map[string]any{"amount": 50000})
	got, err := f.svc.Decide(ctx, bob, r.ID, requests.Decision{Approve: true})
	require.NoError(t, err)
	_, err = f.svc.Revoke(ctx, dave, got.Result.Approval.ID, "wrong account")
	require.Equal(t, authzen.ProblemIneligibleApprover, requests.ErrorCode(err), "only the request's deciders may revoke")
	a, err := f.svc.Revoke(ctx, carol, got.Result.Approval.ID, "wrong account")
	require.NoError(t, err)
	require.Equal(t, "revoked", a.Status)
	_, err = f.svc.Revoke(ctx, carol, r.ID, "again") // by request id works too
	require.Equal(t, authzen.ProblemInvalidTaskState, requests.ErrorCode(err))
	events, err := audit.Chain(ctx, f.db, r.ID)
	require.NoError(t, err)
	require.Equal(t, "approval.revoked", events[len(events)-1].Kind)
}

func TestResolversWaitForTheWindowAndFollowAttributes(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	ctx := context.Background()
	// Put the clock on a Saturday: business_hours is closed until Monday 09:00.
	now := f.clock.Now().UTC()
	daysToSat := (int(time.Saturday) - int(now.Weekday()) + 7) % 7
	sat := time.Date(now.Year(), now.Month(), now.Day(), 12, 0, 0, 0, time.UTC).AddDate(0, 0, daysToSat)
	f.clock.Advance(sat.Sub(now))
	r := f.submitFor("alice", "deploy_service", map[string]any{"service": "api", "version": "1.2"})

	next, err := f.svc.Resolve(ctx, r.ID)
	require.NoError(t, err)
	monday := time.Date(sat.Year(), sat.Month(), sat.Day(), 9, 0, 0, 0, time.UTC).AddDate(0, 0, 2)
	require.Equal(t, monday, next.UTC(), "the resolver waits for the window to open")
	got, err := f.svc.Load(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, requests.Pending, got.Status)

	// An attribute change re-runs resolvers of pending requests: a freeze
	// denies at once.
	var jobs int
	require.NoError(t, f.attrs.Set(ctx, "change_freeze", true, "test", func(ctx context.Context, tx pgx.Tx) error {
		return requests.RecheckPendingTx(ctx, tx, f.jobs)
	}))
	require.NoError(t, f.db.QueryRow(ctx, `SELECT count(*) FROM river.river_job WHERE kind = 'requests.resolve' AND args->>'request_id' = $1`, r.ID).Scan(&jobs))
	require.Equal(t, 2, jobs, "one at submission, one for the change")
	_, err = f.svc.Resolve(ctx, r.ID)
	require.NoError(t, err)
	got, err = f.svc.Load(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, requests.Denied, got.Status)
	require.Equal(t, requests.ReasonDeniedByMachine, got.StatusReason)
	votes, err := f.svc.Votes(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, "resolver:deploy_service.frozen", votes[0].Voter)

	// Without the freeze, inside the window, the resolver approves.
	require.NoError(t, f.attrs.Set(ctx, "change_freeze", nil, "test", nil))
	f.clock.Advance(monday.Sub(f.clock.Now()) + time.Minute)
	r = f.submitFor("alice", "deploy_service", map[string]any{"service": "api", "version": "1.3"})
	next, err = f.svc.Resolve(ctx, r.ID)
	require.NoError(t, err)
	require.True(t, next.IsZero())
	got, err = f.svc.Load(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, requests.Approved, got.Status)
}

// TestResolversSeeOnlyDeclaredContext: an agent can add any member to the
// request context (ARAP makes it an extension point, so it is kept), but an
// automated resolver reads only the members the rule's request schema
// declares: "approved_by": "CFO" approves nothing.
func TestResolversSeeOnlyDeclaredContext(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	ctx := context.Background()
	submit := func(tool string, context map[string]any) *requests.Request {
		req := toolCall(tool, map[string]any{"amount": 10})
		d, hint := f.deny(f.pep, req)
		req.Context = context
		res, err := f.svc.Submit(ctx, f.pep, "", mustJSON(t, submission(req, d, hint)))
		require.NoError(t, err)
		return res.Request
	}
	status := func(id string) requests.Status {
		got, err := f.svc.Load(ctx, id)
		require.NoError(t, err)
		return got.Status
	}

	forged := submit("expense", map[string]any{"ticket": "none", "approved_by": "CFO"})
	require.Equal(t, map[string]any{"ticket": "none", "approved_by": "CFO"}, map[string]any(forged.Context), "the extra member is kept")
	declared, extra := forged.SplitContext()
	require.Equal(t, authzen.Object{"ticket": "none"}, declared)
	require.Equal(t, authzen.Object{"approved_by": "CFO"}, extra)
	_, err := f.svc.Resolve(ctx, forged.ID)
	require.NoError(t, err)
	require.Equal(t, requests.Pending, status(forged.ID), "a resolver reading an undeclared member decides nothing")
	votes, err := f.svc.Votes(ctx, forged.ID)
	require.NoError(t, err)
	require.Empty(t, votes)

	forged = submit("expense_has", map[string]any{"approved_by": "CFO"})
	_, err = f.svc.Resolve(ctx, forged.ID)
	require.NoError(t, err)
	require.Equal(t, requests.Pending, status(forged.ID), "to a resolver, an undeclared member is absent")

	// A declared member is read.
	ok := submit("expense", map[string]any{"ticket": "CHG42", "approved_by": "CFO"})
	_, err = f.svc.Resolve(ctx, ok.ID)
	require.NoError(t, err)
	require.Equal(t, requests.Approved, status(ok.ID))
	votes, err = f.svc.Votes(ctx, ok.ID)
	require.NoError(t, err)
	require.Equal(t, "resolver:expense.ticket_ok", votes[0].Voter)
}

// TestEligibleChannels: a rule's channels refuse a decision through any
// other channel with channel_not_allowed, after the decider's own
// eligibility; no channels allows all; the rule's own resolvers are no
// channel and always decide.
func TestEligibleChannels(t *testing.T) {
	now := time.Now()
	req := func(channels ...string) *requests.Request {
		return &requests.Request{Rule: "r", Status: requests.Pending, ExpiresAt: now.Add(time.Hour),
			Subject:        authzen.Object{"type": "user", "id": "alice"},
			ApprovalPolicy: evaluation.ApprovalPolicy{Quorum: 1, Groups: []string{"treasury"}, Kinds: []string{"itsm"}, Channels: channels}}
	}
	web, api, behalf := bob, requests.ClientVoter("cli_i", "itsm", "itsm"), requests.OnBehalf(bob, "cli_i", "itsm", "itsm")
	resolver := requests.Voter{ID: "resolver:r.auto", Kind: "automation", Name: "r.auto", Resolver: true}
	for _, tc := range []struct {
		channels []string
		allowed  []requests.Voter
		refused  []requests.Voter
	}{
		{nil, []requests.Voter{web, api, behalf, resolver}, nil},
		{[]string{"web"}, []requests.Voter{web, resolver}, []requests.Voter{api, behalf}},
		{[]string{"api"}, []requests.Voter{api, resolver}, []requests.Voter{web, behalf}},
		{[]string{"on_behalf"}, []requests.Voter{behalf, resolver}, []requests.Voter{web, api}},
		{[]string{"web", "on_behalf"}, []requests.Voter{web, behalf, resolver}, []requests.Voter{api}},
	} {
		for _, v := range tc.allowed {
			require.NoError(t, requests.Eligible(v, req(tc.channels...), now), "%v through %q", tc.channels, v.Channel)
		}
		for _, v := range tc.refused {
			err := requests.Eligible(v, req(tc.channels...), now)
			require.Equal(t, authzen.ProblemChannelNotAllowed, requests.ErrorCode(err), "%v through %q: %v", tc.channels, v.Channel, err)
		}
	}
	// The decider's own ineligibility is told first.
	err := requests.Eligible(requests.OnBehalf(dave, "cli_i", "itsm", "itsm"), req("web"), now)
	require.Equal(t, authzen.ProblemIneligibleApprover, requests.ErrorCode(err))
}
