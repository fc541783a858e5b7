package requests_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/passkeys"
	"github.com/omcp/arap/passkeys/passkeytest"
	"github.com/omcp/arap/requests"
)

// passkeyFixture is a requests service whose wire_transfer rule requires a
// signed decision, with bob's passkey registered.
type passkeyFixture struct {
	*fixture
	svc *requests.Service
	pk  *passkeys.Service
	bob *passkeytest.Authenticator
}

func setupPasskeys(t *testing.T) *passkeyFixture {
	t.Helper()
	f := setupWith(t, "testdata/passkey.yaml")
	pk, err := passkeys.New(passkeys.Config{DB: f.db, PublicURL: "http://127.0.0.1:8480", Now: f.clock.Now})
	require.NoError(t, err)
	svc, err := requests.NewService(requests.Config{DB: f.db, Jobs: f.jobs, Keys: f.keys, Policy: f.engine,
		Issuer: issuer, RequestsURL: requestsURL, Now: f.clock.Now, Passkeys: pk})
	require.NoError(t, err)
	ctx := context.Background()
	id, opts, _, err := pk.BeginRegistration(ctx, []byte("s"), "bob")
	require.NoError(t, err)
	a := passkeytest.New("localhost", "http://localhost:8480")
	_, err = pk.FinishRegistration(ctx, []byte("s"), "bob", id, "laptop", a.Register(opts), nil)
	require.NoError(t, err)
	return &passkeyFixture{fixture: f, svc: svc, pk: pk, bob: a}
}

func (f *passkeyFixture) wire(amount int) *requests.Request {
	return f.submitFor("alice", "wire_transfer", map[string]any{"to": "acct-991", "amount": amount})
}

func window() *time.Time {
	u := time.Now().Add(30 * time.Minute).Truncate(time.Second).UTC()
	return &u
}

// TestPasskeyRuleRefusesOtherChannels: on a rule requiring a signed
// decision, the decision API (a client as itself, or for a person) and the
// Slack app are refused with the reason, whoever decides; the rule's own
// resolvers are not a channel.
func TestPasskeyRuleRefusesOtherChannels(t *testing.T) {
	t.Parallel()
	f := setupPasskeys(t)
	ctx := context.Background()
	r := f.wire(50000)
	require.True(t, r.ApprovalPolicy.RequirePasskey, "copied into the request at submission")
	for _, v := range []requests.Voter{
		f.clientVoter("itsm", "itsm"),
		requests.OnBehalf(bob, "cli_x", "itsm-2", "itsm"),
		requests.InSlack(bob),
	} {
		_, err := f.svc.Decide(ctx, v, r.ID, requests.Decision{Approve: true, ApprovedUntil: window(), Assertion: f.bob.Sign([]byte("anything"))})
		require.Equal(t, authzen.ProblemSignatureRequired, requests.ErrorCode(err), "%s through %s: %v", v.ID, v.Channel, err)
		require.ErrorContains(t, err, "rule wire_transfer_large requires a decision signed with the approver's passkey in the web UI")
		require.Error(t, requests.Eligible(v, r, time.Now()), "the UI and notifications see it too")
	}
	resolver := requests.Voter{ID: "resolver:wire_transfer_large.auto", Kind: "automation", Name: "wire_transfer_large.auto", Resolver: true}
	require.NoError(t, requests.Eligible(resolver, r, time.Now()))
	votes, err := f.svc.Votes(ctx, r.ID)
	require.NoError(t, err)
	require.Empty(t, votes)
}

// TestPasskeyRuleNeedsTheRightSignature: a web decision without an
// assertion is refused; so is one signed for another request, another call
// (binding_hash), the other decision or another window, or by a key that
// is not the voter's; nothing is recorded. The right one is accepted, and
// its vote's audit event carries the assertion, which VerifyAudit checks
// from the log alone.
func TestPasskeyRuleNeedsTheRightSignature(t *testing.T) {
	t.Parallel()
	f := setupPasskeys(t)
	ctx := context.Background()
	r, other := f.wire(50000), f.wire(60000)
	require.NotEqual(t, r.BindingHash, other.BindingHash)
	until := window()
	later := until.Add(time.Minute)
	challenge := func(id, bh, decision string, u *time.Time) []byte { return passkeys.Challenge(id, bh, decision, u) }

	_, err := f.svc.Decide(ctx, bob, r.ID, requests.Decision{Approve: true, ApprovedUntil: until})
	require.Equal(t, authzen.ProblemSignatureRequired, requests.ErrorCode(err), "%v", err)
	require.ErrorContains(t, err, "requires a decision signed with your passkey, and this one is not signed")

	carolKey := passkeytest.New("localhost", "http://localhost:8480")
	for name, a := range map[string]*passkeys.Assertion{
		"another request":      f.bob.Sign(challenge(other.ID, r.BindingHash, "approve", until)),
		"another binding_hash": f.bob.Sign(challenge(r.ID, other.BindingHash, "approve", until)),
		"the other decision":   f.bob.Sign(challenge(r.ID, r.BindingHash, "deny", nil)),
		"another window":       f.bob.Sign(challenge(r.ID, r.BindingHash, "approve", &later)),
		"an unregistered key":  carolKey.Sign(challenge(r.ID, r.BindingHash, "approve", until)),
	} {
		_, err := f.svc.Decide(ctx, bob, r.ID, requests.Decision{Approve: true, ApprovedUntil: until, Assertion: a})
		require.Equal(t, authzen.ProblemSignatureRequired, requests.ErrorCode(err), "%s: %v", name, err)
		require.ErrorContains(t, err, "does not verify", name)
	}
	// Carol signs with bob's key: not hers.
	_, err = f.svc.Decide(ctx, carol, r.ID, requests.Decision{Approve: true, ApprovedUntil: until,
		Assertion: f.bob.Sign(challenge(r.ID, r.BindingHash, "approve", until))})
	require.Equal(t, authzen.ProblemSignatureRequired, requests.ErrorCode(err), "%v", err)
	votes, err := f.svc.Votes(ctx, r.ID)
	require.NoError(t, err)
	require.Empty(t, votes, "no refused decision was recorded")

	out, err := f.svc.Decide(ctx, bob, r.ID, requests.Decision{Approve: true, ApprovedUntil: until,
		Assertion: f.bob.Sign(challenge(r.ID, r.BindingHash, "approve", until))})
	require.NoError(t, err)
	require.Equal(t, requests.Approved, out.Status)

	// A signed deny of the other request.
	out, err = f.svc.Decide(ctx, bob, other.ID, requests.Decision{Assertion: f.bob.Sign(challenge(other.ID, other.BindingHash, "deny", nil))})
	require.NoError(t, err)
	require.Equal(t, requests.Denied, out.Status)

	rep, err := passkeys.VerifyAudit(ctx, f.db)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", rep.Failures)
	require.Equal(t, 2, rep.Signed)
}

// TestAuditVerifyFindsARehashedTamperedVote: someone who can write the
// database changes a signed vote (its window, its signature) or strips its
// signature, and recomputes the hash chain so that it verifies; the
// signature check still names the request and the voter.
func TestAuditVerifyFindsARehashedTamperedVote(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, c := range map[string]struct{ update, want string }{
		"a longer window": {`data = jsonb_set(data, '{approved_until}', to_jsonb((data->>'approved_until')::timestamptz + interval '7 days'))`,
			"the signed challenge is not the one derived"},
		"another signature": {`data = jsonb_set(data, '{assertion,signature}', to_jsonb(overlay(data#>>'{assertion,signature}'
			placing CASE WHEN substr(data#>>'{assertion,signature}', 20, 1) = 'A' THEN 'B' ELSE 'A' END from 20 for 1)))`,
			"signature does not verify"},
		"no signature":  {`data = data - 'assertion'`, "carries no signature"},
		"another voter": {`actor = 'user:carol'`, "registered to user:bob, not to the voter"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := setupPasskeys(t)
			r := f.wire(50000)
			until := window()
			_, err := f.svc.Decide(ctx, bob, r.ID, requests.Decision{Approve: true, ApprovedUntil: until,
				Assertion: f.bob.Sign(passkeys.Challenge(r.ID, r.BindingHash, "approve", until))})
			require.NoError(t, err)

			_, err = f.db.Exec(ctx, `UPDATE arap.audit_events SET `+c.update+` WHERE chain = $1 AND kind = 'vote.approve'`, r.ID)
			require.NoError(t, err)
			require.NoError(t, passkeytest.Rehash(ctx, f.db, r.ID))
			chains, err := audit.Verify(ctx, f.db)
			require.NoError(t, err)
			require.True(t, chains.OK(), "the rewritten chain verifies: %v", chains.Breaks)

			rep, err := passkeys.VerifyAudit(ctx, f.db)
			require.NoError(t, err)
			require.Len(t, rep.Failures, 1)
			require.Contains(t, rep.Failures[0].String(), "request "+r.ID+" vote by user:")
			require.Contains(t, rep.Failures[0].String(), c.want)
		})
	}
}
