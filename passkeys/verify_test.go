package passkeys_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/passkeys"
	"github.com/omcp/arap/passkeys/passkeytest"
)

// clocked is a fixture whose service's clock the test sets, so that a
// registration and a removal land where the test's votes need them.
type clocked struct {
	*fixture
	now time.Time
}

func setupClocked(t *testing.T, start time.Time) *clocked {
	db := dbtest.New(t)
	c := &clocked{now: start}
	svc, err := passkeys.New(passkeys.Config{DB: db, PublicURL: "http://127.0.0.1:8480", Now: func() time.Time { return c.now }})
	require.NoError(t, err)
	c.fixture = &fixture{db: db, svc: svc}
	return c
}

// registerAnother registers a for user, who has a passkey (by) already,
// which approves the new one.
func (f *fixture) registerAnother(t *testing.T, user string, by, a *passkeytest.Authenticator) {
	t.Helper()
	ctx := context.Background()
	id, opts, stepUp, err := f.svc.BeginRegistration(ctx, session, user)
	require.NoError(t, err)
	var su struct {
		PublicKey struct {
			Challenge string `json:"challenge"`
		} `json:"publicKey"`
	}
	require.NoError(t, json.Unmarshal(stepUp, &su))
	ch, err := base64.RawURLEncoding.DecodeString(su.PublicKey.Challenge)
	require.NoError(t, err)
	_, err = f.svc.FinishRegistration(ctx, session, user, id, "second", a.Register(opts), by.Sign(ch))
	require.NoError(t, err)
}

// registerWith registers a (an authenticator the test made) as user's
// first passkey.
func (f *fixture) registerWith(t *testing.T, user string, a *passkeytest.Authenticator) {
	t.Helper()
	ctx := context.Background()
	id, opts, _, err := f.svc.BeginRegistration(ctx, session, user)
	require.NoError(t, err)
	_, err = f.svc.FinishRegistration(ctx, session, user, id, "laptop", a.Register(opts), nil)
	require.NoError(t, err)
}

// signedVote appends to request chain id what package requests writes for
// a signed approval: its request.submitted event (binding_hash, the rule
// requiring a passkey) and the vote at, carrying what sign returns for the
// vote's challenge. The chain is intact: only the signature check can find
// what is wrong with the vote.
func (f *fixture) signedVote(t *testing.T, id, voter string, at time.Time, sign func(challenge []byte) *passkeys.Assertion) {
	t.Helper()
	ctx := context.Background()
	const bh = "sha256:4f1c"
	until := at.Add(time.Hour).Truncate(time.Second).UTC()
	require.NoError(t, pgx.BeginFunc(ctx, f.db, func(tx pgx.Tx) error {
		return audit.AppendMany(ctx, tx, []audit.Event{
			{Chain: id, Kind: "request.submitted", Actor: "client:pep", At: at.Add(-time.Minute),
				Data: map[string]any{"binding_hash": bh, "require_passkey": true}},
			{Chain: id, Kind: "vote.approve", Actor: voter, At: at,
				Data: map[string]any{"voter_kind": "human", "reason": "", "approved_until": until,
					"assertion": sign(passkeys.Challenge(id, bh, "approve", &until))}},
		})
	}))
}

// signAs is a.SignAs with the challenge left to the caller.
func signAs(a *passkeytest.Authenticator, typ, origin string, flags byte) func([]byte) *passkeys.Assertion {
	return func(ch []byte) *passkeys.Assertion { return a.SignAs(ch, typ, origin, flags) }
}

// failures is VerifyAudit's failures by request.
func (f *fixture) failures(t *testing.T) (map[string][]string, passkeys.Report) {
	t.Helper()
	rep, err := passkeys.VerifyAudit(context.Background(), f.db)
	require.NoError(t, err)
	out := map[string][]string{}
	for _, fl := range rep.Failures {
		out[fl.RequestID] = append(out[fl.RequestID], fl.Problem)
	}
	return out, rep
}

// TestVerifyAuditChecksEachPart: audit verify refuses a vote signed by the
// voter's registered key over the right challenge when any other part of
// what WebAuthn binds is wrong: the user-verified flag, the relying party
// (rpIdHash), the origin, the client data's type; or when the key was not
// in force at the vote (registered after it, removed before it). Each
// signature verifies, so each problem is found only by its own check; the
// same key's correct votes (before the removal, after the registration)
// verify.
func TestVerifyAuditChecksEachPart(t *testing.T) {
	t.Parallel()
	t0 := time.Now().Add(-24 * time.Hour).Truncate(time.Second).UTC()
	f := setupClocked(t, t0)
	bob := f.register(t, "bob")
	carol := f.register(t, "carol")
	carolLost := passkeytest.New("localhost", "http://localhost:8480")
	f.registerAnother(t, "carol", carol, carolLost)
	f.now = t0.Add(2 * time.Hour)
	require.NoError(t, f.svc.Remove(context.Background(), "carol", base64.RawURLEncoding.EncodeToString(carolLost.ID)))

	elsewhere := *bob // the same key and credential, for another relying party
	elsewhere.RPID = "arap.example.org"
	at := t0.Add(time.Hour)
	for id, c := range map[string]struct {
		voter string
		at    time.Time
		sign  func([]byte) *passkeys.Assertion
	}{
		"arq_good":            {"user:bob", at, bob.Sign},
		"arq_good_before_rm":  {"user:carol", at, carolLost.Sign},
		"arq_no_uv":           {"user:bob", at, signAs(bob, "webauthn.get", bob.Origin, 0x01)},
		"arq_other_rp":        {"user:bob", at, elsewhere.Sign},
		"arq_other_origin":    {"user:bob", at, signAs(bob, "webauthn.get", "http://localhost:9999", 0x05)},
		"arq_create_type":     {"user:bob", at, signAs(bob, "webauthn.create", bob.Origin, 0x05)},
		"arq_before_register": {"user:bob", t0.Add(-time.Hour), bob.Sign},
		"arq_after_removal":   {"user:carol", t0.Add(3 * time.Hour), carolLost.Sign},
	} {
		f.signedVote(t, id, c.voter, c.at, c.sign)
	}

	got, rep := f.failures(t)
	require.Equal(t, 8, rep.Signed)
	want := map[string]string{
		"arq_no_uv":           "the authenticator data does not have the user-verified flag",
		"arq_other_rp":        "the authenticator data is not for relying party localhost",
		"arq_other_origin":    `signed at origin "http://localhost:9999", not the registered "http://localhost:8480"`,
		"arq_create_type":     `the client data's type is "webauthn.create", not webauthn.get`,
		"arq_before_register": "registered only after the vote (" + t0.Format(time.RFC3339) + ")",
		"arq_after_removal":   "removed before the vote (" + t0.Add(2*time.Hour).Format(time.RFC3339) + ")",
	}
	for id, problem := range want {
		require.Len(t, got[id], 1, "%s: %v", id, got[id])
		require.Contains(t, got[id][0], problem, id)
	}
	require.Len(t, got, len(want), "the correct votes verify: %v", got)
}

// TestVerifyAuditAfterACredentialIDIsReused: a credential id can be
// registered again once removed, by anyone (an authenticator chooses its
// ids). Each vote is checked against the registration in force when it was
// cast: bob's vote before his key's removal still verifies once carol has
// registered a key under the same id, and so do carol's after; bob's old
// key after its removal does not, nor after carol's registration.
func TestVerifyAuditAfterACredentialIDIsReused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t0 := time.Now().Add(-24 * time.Hour).Truncate(time.Second).UTC()
	f := setupClocked(t, t0)
	bob := f.register(t, "bob")
	id := base64.RawURLEncoding.EncodeToString(bob.ID)
	f.signedVote(t, "arq_bob_before", "user:bob", t0.Add(time.Hour), bob.Sign)

	require.NoError(t, passkeys.RemoveByOperator(ctx, f.db, "bob", id, "operator:test"))
	system, err := audit.Chain(ctx, f.db, audit.SystemChain)
	require.NoError(t, err)
	removed := system[len(system)-1].At
	f.signedVote(t, "arq_bob_lost", "user:bob", removed.Add(time.Minute), bob.Sign)

	f.now = removed.Add(time.Hour)
	carol := passkeytest.New("localhost", "http://localhost:8480")
	carol.ID = bob.ID
	f.registerWith(t, "carol", carol)
	f.signedVote(t, "arq_carol", "user:carol", f.now.Add(time.Minute), carol.Sign)
	f.signedVote(t, "arq_bob_after", "user:bob", f.now.Add(time.Minute), bob.Sign)

	got, rep := f.failures(t)
	require.Equal(t, 4, rep.Signed)
	require.Len(t, got["arq_bob_lost"], 1, "%v", got)
	require.Contains(t, got["arq_bob_lost"][0], "removed before the vote")
	require.Len(t, got["arq_bob_after"], 1, "%v", got)
	require.Contains(t, got["arq_bob_after"][0], "registered to user:carol, not to the voter")
	require.Len(t, got, 2, "bob's vote before the removal and carol's after her registration verify: %v", got)
}
