package passkeys_test

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
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

func TestMain(m *testing.M) { dbtest.Main(m) }

// TestChallenge: the challenge is a fixed function of its four inputs (a
// known answer, so a third party's implementation can be checked), and
// changing any of them changes it; a deny ignores the window.
func TestChallenge(t *testing.T) {
	until := time.Date(2026, 11, 30, 21, 0, 0, 0, time.UTC)
	c := passkeys.Challenge("req_01", "sha256:abc", "approve", &until)
	// SHA-256 of {"approved_until":"2026-11-30T21:00:00Z","binding_hash":"sha256:abc","decision":"approve","purpose":"arap-passkey-decision/v1","request_id":"req_01"}
	require.Equal(t, "78509fd83efa3a5e65a36f423edbd67366f7c173ae6bff186d16883e76b53f1a", hex.EncodeToString(c))
	later := until.Add(time.Second)
	for name, other := range map[string][]byte{
		"request id":     passkeys.Challenge("req_02", "sha256:abc", "approve", &until),
		"binding_hash":   passkeys.Challenge("req_01", "sha256:abd", "approve", &until),
		"decision":       passkeys.Challenge("req_01", "sha256:abc", "deny", &until),
		"approved_until": passkeys.Challenge("req_01", "sha256:abc", "approve", &later),
		"no window":      passkeys.Challenge("req_01", "sha256:abc", "approve", nil),
	} {
		require.NotEqual(t, c, other, name)
	}
	require.NotEqual(t, passkeys.Challenge("r", "b", "approve", nil), passkeys.Challenge("r", "b", "deny", nil), "the decision alone")
	require.Equal(t, passkeys.Challenge("r", "b", "deny", nil), passkeys.Challenge("r", "b", "deny", &until), "a deny signs no window")
	// Another time zone is the same instant, the same challenge.
	require.Equal(t, c, passkeys.Challenge("req_01", "sha256:abc", "approve", new(until.In(time.FixedZone("x", 3600)))))
}

func TestRelyingParty(t *testing.T) {
	for _, c := range []struct{ url, rpID, origin, err string }{
		{"https://arap.example.com", "arap.example.com", "https://arap.example.com", ""},
		{"https://arap.example.com:8443/", "arap.example.com", "https://arap.example.com:8443", ""},
		{"http://localhost:8480", "localhost", "http://localhost:8480", ""},
		{"http://127.0.0.1:8480", "localhost", "http://localhost:8480", ""},
		{"http://[::1]:8480", "localhost", "http://localhost:8480", ""},
		{"https://10.0.0.5", "", "", "is an IP address, which cannot be a WebAuthn relying party id"},
		{"http://arap.example.com", "", "", "over https"},
	} {
		rpID, origin, err := passkeys.RelyingParty(c.url)
		if c.err != "" {
			require.ErrorContains(t, err, c.err, c.url)
			continue
		}
		require.NoError(t, err, c.url)
		require.Equal(t, c.rpID, rpID, c.url)
		require.Equal(t, c.origin, origin, c.url)
	}
}

type fixture struct {
	db  *pgxpool.Pool
	svc *passkeys.Service
}

func setup(t *testing.T) *fixture {
	db := dbtest.New(t)
	svc, err := passkeys.New(passkeys.Config{DB: db, PublicURL: "http://127.0.0.1:8480"})
	require.NoError(t, err)
	return &fixture{db: db, svc: svc}
}

var session = []byte("session-of-bob")

// register registers a new software passkey for user.
func (f *fixture) register(t *testing.T, user string) *passkeytest.Authenticator {
	t.Helper()
	ctx := context.Background()
	id, opts, stepUp, err := f.svc.BeginRegistration(ctx, session, user)
	require.NoError(t, err)
	require.Nil(t, stepUp, "the first passkey needs no other's approval")
	a := passkeytest.New("localhost", "http://localhost:8480")
	_, err = f.svc.FinishRegistration(ctx, session, user, id, "laptop", a.Register(opts), nil)
	require.NoError(t, err)
	return a
}

// TestRegistration: a registered passkey is listed, and its registration
// is in the audit system chain with the credential id, the COSE public key
// and the relying party; a ceremony is single use and bound to its session.
func TestRegistration(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	a := f.register(t, "bob")
	list, err := f.svc.List(ctx, "bob")
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, a.ID, list[0].CredentialID)
	require.Equal(t, a.COSE(), list[0].PublicKey)
	events, err := audit.Chain(ctx, f.db, audit.SystemChain)
	require.NoError(t, err)
	require.Equal(t, passkeys.EventRegistered, events[len(events)-1].Kind)
	var reg map[string]any
	require.NoError(t, json.Unmarshal(events[len(events)-1].Data, &reg))
	require.Equal(t, list[0].ID(), reg["credential_id"])
	require.Equal(t, list[0].Fingerprint(), reg["fingerprint"])
	require.Equal(t, "localhost", reg["rp_id"])
	require.Equal(t, "http://localhost:8480", reg["origin"])
	require.NotEmpty(t, reg["public_key"])

	// A second passkey: one of bob's must approve it (step-up), so that
	// a session alone cannot enrol another key.
	id, opts, stepUp, err := f.svc.BeginRegistration(ctx, session, "bob")
	require.NoError(t, err)
	var o map[string]map[string]any
	require.NoError(t, json.Unmarshal(opts, &o))
	require.Len(t, o["publicKey"]["excludeCredentials"], 1, "the registered passkey is excluded")
	var su struct {
		PublicKey struct {
			Challenge string `json:"challenge"`
		} `json:"publicKey"`
	}
	require.NoError(t, json.Unmarshal(stepUp, &su))
	stepUpChallenge, err := base64.RawURLEncoding.DecodeString(su.PublicKey.Challenge)
	require.NoError(t, err)
	b := passkeytest.New("localhost", "http://localhost:8480")
	_, err = f.svc.FinishRegistration(ctx, []byte("another session"), "bob", id, "x", b.Register(opts), a.Sign(stepUpChallenge))
	require.ErrorIs(t, err, passkeys.ErrCeremony)
	for name, approval := range map[string]*passkeys.Assertion{
		"no approval":                  nil,
		"the new key approving itself": b.Sign(stepUpChallenge),
		"another challenge":            a.Sign([]byte("another challenge, 32 bytes long")),
	} {
		id, opts, _, err := f.svc.BeginRegistration(ctx, session, "bob")
		require.NoError(t, err)
		_, err = f.svc.FinishRegistration(ctx, session, "bob", id, "x", b.Register(opts), approval)
		require.ErrorIs(t, err, passkeys.ErrInvalid, name)
		require.ErrorContains(t, err, "one of yours to approve it", name)
	}
	_, err = f.svc.FinishRegistration(ctx, session, "bob", id, "x", b.Register(opts), a.Sign(stepUpChallenge))
	require.NoError(t, err)
	_, err = f.svc.FinishRegistration(ctx, session, "bob", id, "x", b.Register(opts), a.Sign(stepUpChallenge))
	require.ErrorIs(t, err, passkeys.ErrCeremony, "single use")

	// Removed under another spelling of its id (the decoder skips line
	// breaks): the event records the id as registration did, so offline
	// verification sees the removal.
	removed := list[0].ID()
	require.NoError(t, f.svc.Remove(ctx, "bob", removed[:4]+"\n"+removed[4:]))
	list, err = f.svc.List(ctx, "bob")
	require.NoError(t, err)
	require.Len(t, list, 1)
	events, err = audit.Chain(ctx, f.db, audit.SystemChain)
	require.NoError(t, err)
	require.Equal(t, passkeys.EventRemoved, events[len(events)-1].Kind)
	require.JSONEq(t, `{"user": "bob", "credential_id": "`+removed+`"}`, string(events[len(events)-1].Data))
	// The last one goes only by an operator (a lost key).
	require.ErrorIs(t, f.svc.Remove(ctx, "bob", list[0].ID()), passkeys.ErrLastPasskey)
	require.NoError(t, passkeys.RemoveByOperator(ctx, f.db, "bob", list[0].ID(), "operator:test"))
	list, err = f.svc.List(ctx, "bob")
	require.NoError(t, err)
	require.Empty(t, list)
}

// TestVerify: an assertion verifies only by the user's own registered key,
// over exactly the challenge, from the origin, with the user verified, and
// with the signature counter moving forward.
func TestVerify(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	a := f.register(t, "bob")
	f.register(t, "carol")
	challenge := passkeys.Challenge("req_1", "bh", "deny", nil)
	verify := func(user string, ch []byte, as *passkeys.Assertion) error {
		return pgx.BeginFunc(ctx, f.db, func(tx pgx.Tx) error {
			_, err := f.svc.Verify(ctx, tx, user, ch, as)
			return err
		})
	}
	require.NoError(t, verify("bob", challenge, a.Sign(challenge)))

	wrongSig := a.Sign(challenge)
	wrongSig.Signature[len(wrongSig.Signature)-3] ^= 1
	noUV := a.SignAs(challenge, "webauthn.get", a.Origin, 0x01)
	elsewhere := a.SignAs(challenge, "webauthn.get", "http://localhost:9999", 0x05)
	create := a.SignAs(challenge, "webauthn.create", a.Origin, 0x05)
	for name, c := range map[string]struct {
		user string
		ch   []byte
		a    *passkeys.Assertion
	}{
		"another challenge":    {"bob", passkeys.Challenge("req_1", "bh", "approve", nil), a.Sign(challenge)},
		"another user's key":   {"carol", challenge, a.Sign(challenge)},
		"a changed signature":  {"bob", challenge, wrongSig},
		"no user verification": {"bob", challenge, noUV},
		"another origin":       {"bob", challenge, elsewhere},
		"a registration":       {"bob", challenge, create},
		"no assertion":         {"bob", challenge, nil},
	} {
		require.ErrorIs(t, verify(c.user, c.ch, c.a), passkeys.ErrAssertion, name)
	}
	a.Count = 0
	require.ErrorContains(t, verify("bob", challenge, a.Sign(challenge)), "counter", "a counter going backwards")
}

// TestDecisionCeremony: the options ask for the derived challenge, the
// user's passkeys and user verification; the ceremony is the session's, for
// that request, and single use; a user without a passkey is told so.
func TestDecisionCeremony(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	a := f.register(t, "bob")
	until := time.Now().Add(time.Hour).Truncate(time.Second).UTC()
	d := passkeys.Decision{RequestID: "req_1", BindingHash: "bh", Decision: "approve", Until: &until}
	_, _, err := f.svc.BeginDecision(ctx, session, "carol", d)
	require.ErrorIs(t, err, passkeys.ErrNoPasskey)
	id, opts, err := f.svc.BeginDecision(ctx, session, "bob", d)
	require.NoError(t, err)
	var o struct {
		PublicKey struct {
			Challenge        string `json:"challenge"`
			RPID             string `json:"rpId"`
			UserVerification string `json:"userVerification"`
			Allow            []struct {
				ID string `json:"id"`
			} `json:"allowCredentials"`
		} `json:"publicKey"`
	}
	require.NoError(t, json.Unmarshal(opts, &o))
	require.Equal(t, passkeys.Assertion{CredentialID: passkeys.Challenge("req_1", "bh", "approve", &until)}.CredentialID.String(), o.PublicKey.Challenge)
	require.Equal(t, "localhost", o.PublicKey.RPID)
	require.Equal(t, "required", o.PublicKey.UserVerification)
	require.Len(t, o.PublicKey.Allow, 1)
	require.Equal(t, passkeys.Assertion{CredentialID: a.ID}.CredentialID.String(), o.PublicKey.Allow[0].ID)

	_, _, err = f.svc.TakeDecision(ctx, []byte("other"), "bob", id, "req_1")
	require.ErrorIs(t, err, passkeys.ErrCeremony, "another session")
	_, _, err = f.svc.TakeDecision(ctx, session, "bob", id, "req_2")
	require.ErrorIs(t, err, passkeys.ErrCeremony, "another request")
	id, _, err = f.svc.BeginDecision(ctx, session, "bob", d)
	require.NoError(t, err)
	dec, u, err := f.svc.TakeDecision(ctx, session, "bob", id, "req_1")
	require.NoError(t, err)
	require.Equal(t, "approve", dec)
	require.True(t, until.Equal(*u))
	_, _, err = f.svc.TakeDecision(ctx, session, "bob", id, "req_1")
	require.ErrorIs(t, err, passkeys.ErrCeremony, "single use")
}

// TestVerifyRecordsWithoutSubmission: a person's unsigned vote on a chain
// that lost its request.submitted event is reported, since nobody can tell
// whether it needed a signature; a resolver's is not.
func TestVerifyRecordsWithoutSubmission(t *testing.T) {
	rep := passkeys.VerifyRecords([]audit.Record{
		{Chain: "arq_x", Seq: 2, Kind: "vote.approve", Actor: "user:bob", Data: []byte(`{"voter_kind": "human"}`)},
		{Chain: "arq_x", Seq: 3, Kind: "vote.approve", Actor: "resolver:r.ok", Data: []byte(`{"voter_kind": "automation"}`)},
	})
	require.Len(t, rep.Failures, 1)
	require.Contains(t, rep.Failures[0].String(), "vote by user:bob")
	require.Contains(t, rep.Failures[0].String(), "no request.submitted event")
}
