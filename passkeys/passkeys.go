package passkeys

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/go-webauthn/webauthn/protocol"
	"github.com/go-webauthn/webauthn/webauthn"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/audit"
)

// Audit event kinds, in the system chain.
const (
	EventRegistered = "passkey.registered"
	EventRemoved    = "passkey.removed"
)

// CeremonyTTL bounds a ceremony in progress: long enough to touch a key,
// short enough that a stale page starts again.
const CeremonyTTL = 5 * time.Minute

// Errors a caller can test with errors.Is.
var (
	// ErrAssertion: the assertion does not verify (wrong key, challenge,
	// origin, relying party, flags or signature).
	ErrAssertion = errors.New("the passkey signature does not verify")
	// ErrNoPasskey: the user has registered none.
	ErrNoPasskey = errors.New("no passkey registered")
	// ErrCeremony: no such ceremony in progress for this session (expired,
	// already used, or another session's).
	ErrCeremony = errors.New("the passkey ceremony expired or was already used; start again")
)

// RelyingParty derives the WebAuthn relying party from the backend's public
// URL: its host is the RP id, its origin the one allowed origin. An IP
// address cannot be an RP id; a loopback one (dev mode, tests) maps to
// "localhost" on the same port, which reaches the same listener and which
// browsers treat as a secure context over plain http. Any other IP address
// is an error saying why.
func RelyingParty(publicURL string) (rpID, origin string, err error) {
	u, err := url.Parse(strings.TrimRight(publicURL, "/"))
	if err != nil || u.Host == "" {
		return "", "", fmt.Errorf("passkeys: public URL %q is not an absolute URL", publicURL)
	}
	host := u.Hostname()
	if ip := net.ParseIP(host); ip != nil {
		if !ip.IsLoopback() {
			return "", "", fmt.Errorf("passkeys need the web UI at a domain name: the public URL's host %s is an IP address, which cannot be a WebAuthn relying party id (set --public-url to https://<domain>)", host)
		}
		host = "localhost"
	}
	origin = u.Scheme + "://" + host
	if p := u.Port(); p != "" {
		origin += ":" + p
	}
	if u.Scheme != "https" && host != "localhost" {
		return "", "", fmt.Errorf("passkeys need the web UI over https (browsers allow WebAuthn only in a secure context); the public URL is %s", publicURL)
	}
	return host, origin, nil
}

// Config configures a Service.
type Config struct {
	DB *pgxpool.Pool
	// PublicURL is the backend's public URL (RelyingParty).
	PublicURL string
	Now       func() time.Time
}

// Service holds the passkeys and runs the ceremonies.
type Service struct {
	db     *pgxpool.Pool
	wa     *webauthn.WebAuthn
	rpID   string
	origin string
	now    func() time.Time
}

// New returns the Service, or an error saying why passkeys are unavailable
// at this public URL.
func New(cfg Config) (*Service, error) {
	if cfg.DB == nil {
		return nil, errors.New("passkeys: DB is required")
	}
	rpID, origin, err := RelyingParty(cfg.PublicURL)
	if err != nil {
		return nil, err
	}
	wa, err := webauthn.New(&webauthn.Config{RPID: rpID, RPDisplayName: "arap approvals", RPOrigins: []string{origin}})
	if err != nil {
		return nil, fmt.Errorf("passkeys: relying party %s: %w", rpID, err)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Service{db: cfg.DB, wa: wa, rpID: rpID, origin: origin, now: cfg.Now}, nil
}

// RPID is the relying party id; Origin the allowed origin.
func (s *Service) RPID() string   { return s.rpID }
func (s *Service) Origin() string { return s.origin }

// Passkey is a registered credential.
type Passkey struct {
	User         string
	CredentialID []byte
	PublicKey    []byte // COSE_Key
	SignCount    uint32
	AAGUID       []byte
	Name         string
	CreatedAt    time.Time
	LastUsedAt   *time.Time
}

// ID is the credential id, base64url.
func (p Passkey) ID() string { return base64.RawURLEncoding.EncodeToString(p.CredentialID) }

// Fingerprint is the SHA-256 of the COSE public key, hex: what an operator
// pins or exports to check the registrations in the audit log against.
func (p Passkey) Fingerprint() string { return Fingerprint(p.PublicKey) }

// Fingerprint is the SHA-256 of a COSE public key, hex.
func Fingerprint(cose []byte) string {
	sum := sha256.Sum256(cose)
	return hex.EncodeToString(sum[:])
}

const passkeyColumns = `user_name, credential_id, public_key, sign_count, aaguid, name, created_at, last_used_at`

// List returns the passkeys of user, or of everyone when user is empty,
// oldest first.
func (s *Service) List(ctx context.Context, user string) ([]Passkey, error) {
	return list(ctx, s.db, user)
}

// List returns the passkeys of user (everyone's when empty) from db, for
// tools that have a database but no relying party (arapctl).
func List(ctx context.Context, db *pgxpool.Pool, user string) ([]Passkey, error) {
	return list(ctx, db, user)
}

func list(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, user string) ([]Passkey, error) {
	rows, err := q.Query(ctx, `SELECT `+passkeyColumns+` FROM arap.passkeys WHERE $1 = '' OR user_name = $1 ORDER BY user_name, created_at`, user)
	if err != nil {
		return nil, fmt.Errorf("passkeys: list: %w", err)
	}
	defer rows.Close()
	var out []Passkey
	for rows.Next() {
		var p Passkey
		var count int64
		if err := rows.Scan(&p.User, &p.CredentialID, &p.PublicKey, &count, &p.AAGUID, &p.Name, &p.CreatedAt, &p.LastUsedAt); err != nil {
			return nil, fmt.Errorf("passkeys: list: %w", err)
		}
		p.SignCount = uint32(count)
		out = append(out, p)
	}
	return out, rows.Err()
}

// waUser is a person as go-webauthn sees them.
type waUser struct {
	name  string
	creds []webauthn.Credential
}

// UserHandle is the WebAuthn user handle of a person: SHA-256 of
// "arap-user:" and the name, so it is stable and carries no name.
func UserHandle(name string) []byte {
	sum := sha256.Sum256([]byte("arap-user:" + name))
	return sum[:]
}

func (u *waUser) WebAuthnID() []byte                         { return UserHandle(u.name) }
func (u *waUser) WebAuthnName() string                       { return u.name }
func (u *waUser) WebAuthnDisplayName() string                { return u.name }
func (u *waUser) WebAuthnCredentials() []webauthn.Credential { return u.creds }

func descriptors(list []Passkey) []protocol.CredentialDescriptor {
	out := make([]protocol.CredentialDescriptor, len(list))
	for i, p := range list {
		out[i] = protocol.CredentialDescriptor{Type: protocol.PublicKeyCredentialType, CredentialID: p.CredentialID}
	}
	return out
}

// ErrInvalid: the browser's input is refused (the message says why).
var ErrInvalid = errors.New("refused")

// registration is the audit record of a registered passkey: all that
// verifying its signatures offline needs.
type registration struct {
	User         string                    `json:"user"`
	CredentialID protocol.URLEncodedBase64 `json:"credential_id"`
	PublicKey    protocol.URLEncodedBase64 `json:"public_key"` // COSE_Key
	Fingerprint  string                    `json:"fingerprint"`
	AAGUID       string                    `json:"aaguid,omitempty"`
	Name         string                    `json:"name"`
	RPID         string                    `json:"rp_id"`
	Origin       string                    `json:"origin"`
}

// ErrLastPasskey: a person's last passkey is removed by an operator
// (arapctl passkeys remove), not from their session: otherwise a stolen
// session could remove it and enrol the thief's key as the first one.
var ErrLastPasskey = errors.New("your last passkey can be removed only by an administrator (arapctl passkeys remove); register another one first if you are replacing it")

// Remove deletes user's passkey credentialID (base64url) at the user's
// request, unless it is their last one, recording it in the audit system
// chain.
func (s *Service) Remove(ctx context.Context, user, credentialID string) error {
	return remove(ctx, s.db, s.now(), user, credentialID, "user:"+user, false)
}

// RemoveByOperator deletes user's passkey credentialID (base64url), even
// their last one (a lost key), as actor, recording it in the audit system
// chain.
func RemoveByOperator(ctx context.Context, db *pgxpool.Pool, user, credentialID, actor string) error {
	return remove(ctx, db, time.Now(), user, credentialID, actor, true)
}

func remove(ctx context.Context, db *pgxpool.Pool, now time.Time, user, credentialID, actor string, last bool) error {
	raw, err := base64.RawURLEncoding.DecodeString(credentialID)
	if err != nil {
		return fmt.Errorf("%w: no such passkey", ErrInvalid)
	}
	// Recorded as registration records it: the decoder also takes other
	// spellings of the same bytes (line breaks, non-zero trailing bits),
	// and offline verification finds a removal by the recorded id.
	credentialID = base64.RawURLEncoding.EncodeToString(raw)
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		// The user's passkeys are locked, so two removals cannot each
		// leave the other as the last one.
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM arap.passkeys WHERE user_name = $1 FOR UPDATE) p`, user).Scan(&n); err != nil {
			return fmt.Errorf("passkeys: remove: %w", err)
		}
		tag, err := tx.Exec(ctx, `DELETE FROM arap.passkeys WHERE credential_id = $1 AND user_name = $2`, raw, user)
		if err != nil {
			return fmt.Errorf("passkeys: remove: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("%w: no such passkey", ErrInvalid)
		}
		if n == 1 && !last {
			return ErrLastPasskey
		}
		return audit.Append(ctx, tx, audit.Event{Chain: audit.SystemChain, Kind: EventRemoved, Actor: actor, At: now,
			Data: map[string]any{"user": user, "credential_id": credentialID}})
	})
}

func credentials(list []Passkey) []webauthn.Credential {
	out := make([]webauthn.Credential, len(list))
	for i, p := range list {
		out[i] = webauthn.Credential{ID: p.CredentialID, PublicKey: p.PublicKey,
			Authenticator: webauthn.Authenticator{AAGUID: p.AAGUID, SignCount: p.SignCount}}
	}
	return out
}

// Verify checks a, an assertion by user's registered passkey, against
// challenge, within tx (the caller's, which records the vote): the
// credential is user's, the client data is a webauthn.get for challenge
// from this origin, the authenticator data is for this RP id with the user
// present and verified, the signature verifies with the registered key,
// and the signature counter did not go backwards; the counter is then
// stored. It returns the credential id. A failure wraps ErrAssertion.
func (s *Service) Verify(ctx context.Context, tx pgx.Tx, user string, challenge []byte, a *Assertion) ([]byte, error) {
	if !a.Complete() {
		return nil, fmt.Errorf("%w: the assertion is incomplete", ErrAssertion)
	}
	var cred webauthn.Credential
	var count int64
	err := tx.QueryRow(ctx, `SELECT credential_id, public_key, sign_count, aaguid, backup_eligible FROM arap.passkeys
		WHERE credential_id = $1 AND user_name = $2 FOR UPDATE`, []byte(a.CredentialID), user).
		Scan(&cred.ID, &cred.PublicKey, &count, &cred.Authenticator.AAGUID, &cred.Flags.BackupEligible)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: the passkey that signed is not one registered to %s", ErrAssertion, user)
	}
	if err != nil {
		return nil, fmt.Errorf("passkeys: load credential: %w", err)
	}
	cred.Authenticator.SignCount = uint32(count)
	body, _ := json.Marshal(map[string]any{
		"id": a.CredentialID, "rawId": a.CredentialID, "type": "public-key",
		"response": map[string]any{"authenticatorData": a.AuthenticatorData, "clientDataJSON": a.ClientDataJSON,
			"signature": a.Signature, "userHandle": a.UserHandle},
		"clientExtensionResults": map[string]any{},
	})
	parsed, err := protocol.ParseCredentialRequestResponseBytes(body)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrAssertion, describe(err))
	}
	got, err := s.wa.ValidateLogin(&waUser{name: user, creds: []webauthn.Credential{cred}}, webauthn.SessionData{
		Challenge: base64.RawURLEncoding.EncodeToString(challenge), RelyingPartyID: s.rpID, UserID: UserHandle(user),
		UserVerification: protocol.VerificationRequired,
	}, parsed)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrAssertion, describe(err))
	}
	if got.Authenticator.CloneWarning {
		return nil, fmt.Errorf("%w: the passkey's signature counter did not advance (%d after %d): the key may have been cloned",
			ErrAssertion, got.Authenticator.SignCount, count)
	}
	if _, err := tx.Exec(ctx, `UPDATE arap.passkeys SET sign_count = greatest(sign_count, $2), last_used_at = $3 WHERE credential_id = $1`,
		cred.ID, int64(parsed.Response.AuthenticatorData.Counter), s.now()); err != nil {
		return nil, fmt.Errorf("passkeys: store the signature counter: %w", err)
	}
	return bytes.Clone(cred.ID), nil
}

// describe is a go-webauthn error in words: its details, which say which
// check failed.
func describe(err error) string {
	var pe *protocol.Error
	if errors.As(err, &pe) {
		if pe.DevInfo != "" {
			return pe.Details + " (" + pe.DevInfo + ")"
		}
		return pe.Details
	}
	return err.Error()
}
