package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/passkeys"
	"github.com/omcp/arap/passkeys/passkeytest"
)

// TestAuditVerifySignedDecisions: `arapctl audit verify` checks each
// passkey-signed vote against the key the audit log registered, and fails,
// naming the request and the voter, for a vote whose authenticator did not
// verify the user (no UV flag) and for one signed with a passkey an
// operator had removed before the vote (a lost key). The votes' chains are
// intact (appended as package requests appends them, as someone with
// write access to the database could): only the signature check finds them.
func TestAuditVerifySignedDecisions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.URL(t)
	urlFile := filepath.Join(t.TempDir(), "database-url")
	require.NoError(t, os.WriteFile(urlFile, []byte(url), 0o600))
	db, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer db.Close()
	verify := func() (string, error) { return ctl(t, "audit", "verify", "--database-url-file", urlFile) }

	svc, err := passkeys.New(passkeys.Config{DB: db, PublicURL: "http://127.0.0.1:8480"})
	require.NoError(t, err)
	laptop := passkeytest.New("localhost", "http://localhost:8480")
	phone := passkeytest.New("localhost", "http://localhost:8480")
	registerPasskey(t, svc, "bob", laptop, nil)
	registerPasskey(t, svc, "bob", phone, laptop)
	keys, err := passkeys.List(ctx, db, "bob")
	require.NoError(t, err)
	require.Len(t, keys, 2)
	registered := keys[len(keys)-1].CreatedAt

	signedVote(t, db, "arq_good", registered.Add(time.Minute), laptop.Sign)
	out, err := verify()
	require.NoError(t, err, out)
	require.Contains(t, out, "signed decisions: 1, all verify")

	signedVote(t, db, "arq_no_uv", registered.Add(time.Minute), func(ch []byte) *passkeys.Assertion {
		return laptop.SignAs(ch, "webauthn.get", laptop.Origin, 0x01) // user present, not verified
	})
	out, err = verify()
	require.ErrorContains(t, err, "audit: 1 signed decisions do not verify")
	require.Contains(t, out, "all intact", "the chains are intact; the signature is what is wrong")
	require.Contains(t, out, "SIGNATURE: request arq_no_uv vote by user:bob (seq 2): the authenticator data does not have the user-verified flag")

	phoneID := base64.RawURLEncoding.EncodeToString(phone.ID)
	out, err = ctl(t, "passkeys", "remove", phoneID, "--user", "bob", "--database-url-file", urlFile)
	require.NoError(t, err, out)
	system, err := audit.Chain(ctx, db, audit.SystemChain)
	require.NoError(t, err)
	removal := system[len(system)-1]
	require.Equal(t, passkeys.EventRemoved, removal.Kind)
	signedVote(t, db, "arq_lost_key", removal.At.Add(time.Minute), phone.Sign)
	out, err = verify()
	require.ErrorContains(t, err, "audit: 2 signed decisions do not verify")
	require.Contains(t, out, "SIGNATURE: request arq_lost_key vote by user:bob (seq 2): signed with passkey "+phoneID+
		", removed before the vote ("+removal.At.UTC().Format(time.RFC3339)+")")
	require.Contains(t, out, "SIGNATURE: request arq_no_uv vote by user:bob")
	require.NotContains(t, out, "arq_good")
}

// registerPasskey registers a as user's passkey through the web UI's ceremony,
// approved by by when user has one already.
func registerPasskey(t *testing.T, svc *passkeys.Service, user string, a, by *passkeytest.Authenticator) {
	t.Helper()
	ctx := context.Background()
	session := []byte("session-of-" + user)
	id, opts, stepUp, err := svc.BeginRegistration(ctx, session, user)
	require.NoError(t, err)
	var approval *passkeys.Assertion
	if by != nil {
		var su struct {
			PublicKey struct {
				Challenge string `json:"challenge"`
			} `json:"publicKey"`
		}
		require.NoError(t, json.Unmarshal(stepUp, &su))
		ch, err := base64.RawURLEncoding.DecodeString(su.PublicKey.Challenge)
		require.NoError(t, err)
		approval = by.Sign(ch)
	}
	_, err = svc.FinishRegistration(ctx, session, user, id, "key", a.Register(opts), approval)
	require.NoError(t, err)
}

// signedVote appends request chain id as package requests writes it for bob's
// signed approval on a rule requiring a passkey: request.submitted, then
// the vote at, carrying what sign returns for the vote's challenge.
func signedVote(t *testing.T, db *pgxpool.Pool, id string, at time.Time, sign func([]byte) *passkeys.Assertion) {
	t.Helper()
	ctx := context.Background()
	const bh = "sha256:4f1c"
	until := at.Add(time.Hour).Truncate(time.Second).UTC()
	require.NoError(t, pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		return audit.AppendMany(ctx, tx, []audit.Event{
			{Chain: id, Kind: "request.submitted", Actor: "client:pep", At: at.Add(-time.Minute),
				Data: map[string]any{"binding_hash": bh, "require_passkey": true}},
			{Chain: id, Kind: "vote.approve", Actor: "user:bob", At: at,
				Data: map[string]any{"voter_kind": "human", "reason": "", "approved_until": until,
					"assertion": sign(passkeys.Challenge(id, bh, "approve", &until))}},
		})
	}))
}
