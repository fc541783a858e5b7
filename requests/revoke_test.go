package requests_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/directory"
	"github.com/omcp/arap/requests"
)

// The chaos run's violation (issue 40): a re-evaluation read the approval
// active, a revocation committed and was answered 200, and the evaluation
// then allowed the call, which ran. Use and revocation are serialized on the
// approval's row: whichever commits first decides, and the other sees it.

// TestRevocationBeforeUseWins: a revocation that commits between the
// evaluation's read of the approval and the recording of its use makes the
// evaluation refuse (approval_expired), and nothing is marked used.
func TestRevocationBeforeUseWins(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	ctx := context.Background()
	call, approval := f.approved(bob, "wire_transfer", map[string]any{"to": "acct-7", "amount": 50000})
	revoked := false
	requests.SetUseHooks(f.approvals, func() {
		if revoked {
			return
		}
		revoked = true
		_, err := f.svc.Revoke(ctx, carol, approval["id"].(string), "changed my mind")
		require.NoError(t, err, "the revocation comes first and is acknowledged")
	}, nil)
	requireDeny(t, f.reevaluate(f.pepID, call, approval), authzen.ReasonApprovalExpired, authzen.NextActionRequest)
	require.True(t, revoked)
	requireDeny(t, f.reevaluate(f.pepID, call, approval), authzen.ReasonApprovalExpired, authzen.NextActionRequest)

	rec, err := f.approvals.Approval(ctx, approval["id"].(string))
	require.NoError(t, err)
	require.Nil(t, rec.UsedAt, "a refused evaluation marks no use")
	// The trail says so: revoked, then evaluated false.
	kinds := chainKinds(t, f, rec.RequestID)
	require.Equal(t, []string{"approval.revoked", "approval.evaluated", "approval.evaluated"}, kinds[len(kinds)-3:])
}

// TestRevocationAfterUseIsRefused: once a re-evaluation has allowed a call
// with the approval, a revocation is answered approval_already_used with
// when and by which evaluation, never "revoked"; the approval stays usable.
func TestRevocationAfterUseIsRefused(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	ctx := context.Background()
	call, approval := f.approved(bob, "wire_transfer", map[string]any{"to": "acct-8", "amount": 50000})
	d := f.reevaluate(f.pepID, call, approval)
	require.True(t, d.Decision, "%+v", d)

	_, err := f.svc.Revoke(ctx, carol, approval["id"].(string), "too late")
	var re *requests.Error
	require.True(t, errors.As(err, &re), "%v", err)
	require.Equal(t, authzen.ProblemApprovalAlreadyUsed, re.Code, "%v", err)
	require.Equal(t, d.Context[authzen.CtxEvaluationID], re.UsedBy)
	require.NotNil(t, re.UsedAt)
	require.Contains(t, re.Detail, re.UsedBy)
	// By request id too, and by the system.
	rec, err := f.approvals.Approval(ctx, approval["id"].(string))
	require.NoError(t, err)
	_, err = f.svc.Revoke(ctx, requests.Voter{ID: "system"}, rec.RequestID, "")
	require.Equal(t, authzen.ProblemApprovalAlreadyUsed, requests.ErrorCode(err), "%v", err)

	require.True(t, f.reevaluate(f.pepID, call, approval).Decision, "a used approval is still the same approval")
	rec2, err := f.approvals.Approval(ctx, approval["id"].(string))
	require.NoError(t, err)
	require.Equal(t, evaluationActive, rec2.Status)
	require.True(t, rec.UsedAt.Equal(*rec2.UsedAt), "the first use is kept")
	require.Equal(t, re.UsedBy, rec2.UsedBy)
}

const evaluationActive = "active"

// TestRevocationWaitsForAUseInFlight: a revocation made while an evaluation
// holds the approval (used, not yet committed) waits for it, then finds it
// used: it is never acknowledged for an approval being used.
func TestRevocationWaitsForAUseInFlight(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	ctx := context.Background()
	call, approval := f.approved(bob, "wire_transfer", map[string]any{"to": "acct-9", "amount": 50000})
	revoke := make(chan error, 1)
	requests.SetUseHooks(f.approvals, nil, func() {
		go func() {
			_, err := f.svc.Revoke(ctx, carol, approval["id"].(string), "racing")
			revoke <- err
		}()
		// Until the revocation waits for this transaction's lock, or has
		// answered without waiting (the violation).
		for {
			select {
			case err := <-revoke:
				revoke <- err
				return
			default:
			}
			var waiting int
			require.NoError(t, f.db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting))
			if waiting > 0 {
				return
			}
			time.Sleep(5 * time.Millisecond) // polling pg_stat_activity
		}
	})
	require.True(t, f.reevaluate(f.pepID, call, approval).Decision)
	err := <-revoke
	require.Equal(t, authzen.ProblemApprovalAlreadyUsed, requests.ErrorCode(err), "a revocation racing a use is refused, never acknowledged: %v", err)
	rec, err := f.approvals.Approval(ctx, approval["id"].(string))
	require.NoError(t, err)
	require.Equal(t, evaluationActive, rec.Status)
}

func chainKinds(t *testing.T, f *fixture, chain string) []string {
	t.Helper()
	events, err := audit.Chain(context.Background(), f.db, chain)
	require.NoError(t, err)
	var kinds []string
	for _, e := range events {
		kinds = append(kinds, e.Kind)
	}
	return kinds
}

// withDirectory is f's service deciding with the directory's view of each
// person (Config.People), with bob and carol in group treasury.
func withDirectory(t *testing.T, f *fixture) (*requests.Service, *directory.Store) {
	t.Helper()
	ctx := context.Background()
	dir := directory.NewStore(f.db)
	require.NoError(t, dir.CreateGroup(ctx, "treasury", "test"))
	for _, name := range []string{"bob", "carol"} {
		require.NoError(t, dir.CreateUser(ctx, directory.User{Name: name, DisplayName: name}, "", "test"))
		require.NoError(t, dir.AddMember(ctx, "treasury", name, "test"))
	}
	svc, err := requests.NewService(requests.Config{DB: f.db, Jobs: f.jobs, Keys: f.keys, Policy: f.engine,
		Issuer: issuer, RequestsURL: requestsURL, Now: f.clock.Now, People: dir})
	require.NoError(t, err)
	return svc, dir
}

// TestDisabledApproverCannotVote (issue 40, item 4): a person's vote
// re-reads them in its own transaction, whatever the Voter built from a
// session or a Slack click says. Disabled before the vote: refused; removed
// from the group: refused; and a vote in flight while they are being
// disabled waits for it and is then refused, so an administrator told
// "disabled" never sees a vote of theirs recorded after.
func TestDisabledApproverCannotVote(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	ctx := context.Background()
	svc, dir := withDirectory(t, f)
	submit := func() string {
		d, hint := f.deny(f.pep, toolCall("wire_transfer", map[string]any{"to": "x", "amount": 50000 + len(t.Name())}))
		call := toolCall("wire_transfer", map[string]any{"to": "x", "amount": 50000 + len(t.Name())})
		res, err := svc.Submit(ctx, f.pep, "", mustJSON(t, submission(call, d, hint)))
		require.NoError(t, err)
		return res.Request.ID
	}
	id := submit()
	require.NoError(t, dir.DisableUser(ctx, "bob", "test"))
	_, err := svc.Decide(ctx, bob, id, requests.Decision{Approve: true})
	require.Equal(t, authzen.ProblemIneligibleApprover, requests.ErrorCode(err), "a disabled person's stale Voter still voted: %v", err)

	require.NoError(t, dir.RemoveMember(ctx, "treasury", "carol", "test"))
	_, err = svc.Decide(ctx, carol, id, requests.Decision{Approve: true})
	require.Equal(t, authzen.ProblemIneligibleApprover, requests.ErrorCode(err), "group membership is read at the vote: %v", err)
	require.NoError(t, dir.AddMember(ctx, "treasury", "carol", "test"))

	// In flight: carol's disabling is written, not committed, when she votes.
	tx, err := f.db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `UPDATE arap.users SET disabled_at = now() WHERE name = 'carol'`)
	require.NoError(t, err)
	voted := make(chan error, 1)
	go func() { _, err := svc.Decide(ctx, carol, id, requests.Decision{Approve: true}); voted <- err }()
	for waiting := 0; waiting == 0; {
		select {
		case err := <-voted:
			t.Fatalf("the vote did not wait for the disabling in flight: %v", err)
		default:
		}
		require.NoError(t, f.db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting))
		time.Sleep(5 * time.Millisecond) // polling pg_stat_activity
	}
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, authzen.ProblemIneligibleApprover, requests.ErrorCode(<-voted))
	votes, err := svc.Votes(ctx, id)
	require.NoError(t, err)
	require.Empty(t, votes)
}
