package passkeys

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-webauthn/webauthn/protocol"
	"github.com/go-webauthn/webauthn/webauthn"
	"github.com/jackc/pgx/v5"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/internal/clean"
)

// The ceremonies: registering a passkey and signing a decision, each a
// short-lived, single-use row bound to the UI session that began it.

func newCeremonyID() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// registrationCeremony is what a registration in progress keeps.
type registrationCeremony struct {
	Create webauthn.SessionData `json:"create"`
	// StepUp is the challenge one of the user's passkeys must sign before
	// another is added, when they have one: a session alone (a stolen
	// cookie) cannot enrol the thief's key.
	StepUp []byte `json:"step_up,omitempty"`
}

// BeginRegistration starts registering a passkey for user in the web UI
// session whose cookie hashes to session. It returns the ceremony id, the
// options for navigator.credentials.create ({"publicKey": ...}), and, when
// the user has passkeys already, the options for navigator.credentials.get
// with which one of them must approve the new one (else nil).
func (s *Service) BeginRegistration(ctx context.Context, session []byte, user string) (id string, create, stepUp json.RawMessage, err error) {
	existing, err := s.List(ctx, user)
	if err != nil {
		return "", nil, nil, err
	}
	creation, data, err := s.wa.BeginRegistration(&waUser{name: user},
		webauthn.WithAuthenticatorSelection(protocol.AuthenticatorSelection{
			ResidentKey: protocol.ResidentKeyRequirementPreferred, UserVerification: protocol.VerificationRequired,
		}),
		webauthn.WithExclusions(descriptors(existing)))
	if err != nil {
		return "", nil, nil, fmt.Errorf("passkeys: begin registration: %w", err)
	}
	cer := registrationCeremony{Create: *data}
	if len(existing) > 0 {
		cer.StepUp = make([]byte, 32)
		_, _ = rand.Read(cer.StepUp)
		assertion, _, err := s.wa.BeginLogin(&waUser{name: user, creds: credentials(existing)},
			webauthn.WithChallenge(cer.StepUp), webauthn.WithUserVerification(protocol.VerificationRequired))
		if err != nil {
			return "", nil, nil, fmt.Errorf("passkeys: begin registration: %w", err)
		}
		if stepUp, err = json.Marshal(assertion); err != nil {
			return "", nil, nil, err
		}
	}
	sd, err := json.Marshal(cer)
	if err != nil {
		return "", nil, nil, err
	}
	id = newCeremonyID()
	if _, err := s.db.Exec(ctx, `INSERT INTO arap.passkey_ceremonies (id, session_hash, user_name, kind, session_data, expires_at)
		VALUES ($1, $2, $3, 'register', $4, $5)`, id, session, user, sd, s.now().Add(CeremonyTTL)); err != nil {
		return "", nil, nil, fmt.Errorf("passkeys: begin registration: %w", err)
	}
	create, err = json.Marshal(creation)
	return id, create, stepUp, err
}

// take removes and returns the ceremony id of kind for session and user, if
// it is still valid; expired ones go with it.
func take(ctx context.Context, tx pgx.Tx, now time.Time, id string, session []byte, user, kind string) (requestID, decision *string, until *time.Time, sd []byte, err error) {
	if _, err = tx.Exec(ctx, `DELETE FROM arap.passkey_ceremonies WHERE expires_at < $1`, now); err != nil {
		return nil, nil, nil, nil, fmt.Errorf("passkeys: sweep ceremonies: %w", err)
	}
	err = tx.QueryRow(ctx, `DELETE FROM arap.passkey_ceremonies WHERE id = $1 AND session_hash = $2 AND user_name = $3 AND kind = $4
		RETURNING request_id, decision, approved_until, session_data`, id, session, user, kind).Scan(&requestID, &decision, &until, &sd)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, nil, nil, ErrCeremony
	}
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("passkeys: take ceremony: %w", err)
	}
	return requestID, decision, until, sd, nil
}

// FinishRegistration completes ceremony id with the browser's response
// (the PublicKeyCredential as JSON) and, when the ceremony asked for one,
// the assertion by one of the user's passkeys over its step-up challenge;
// it stores the passkey under name, recording it, with its public key, in
// the audit system chain.
func (s *Service) FinishRegistration(ctx context.Context, session []byte, user, id, name string, response []byte, stepUp *Assertion) (*Passkey, error) {
	name = strings.TrimSpace(name)
	if name == "" {
		name = "passkey"
	}
	if utf8.RuneCountInString(name) > 64 || clean.Text(name) != nil {
		return nil, fmt.Errorf("%w: the name must be at most 64 plain characters", ErrInvalid)
	}
	parsed, err := protocol.ParseCredentialCreationResponseBytes(response)
	if err != nil {
		return nil, fmt.Errorf("%w: the browser's response cannot be read: %v", ErrInvalid, err)
	}
	var out *Passkey
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		now := s.now()
		_, _, _, sd, err := take(ctx, tx, now, id, session, user, "register")
		if err != nil {
			return err
		}
		var cer registrationCeremony
		if err := json.Unmarshal(sd, &cer); err != nil {
			return fmt.Errorf("passkeys: ceremony data: %w", err)
		}
		if cer.StepUp != nil {
			if stepUp == nil {
				return fmt.Errorf("%w: you have a passkey already; adding another needs one of yours to approve it", ErrInvalid)
			}
			if _, err := s.Verify(ctx, tx, user, cer.StepUp, stepUp); err != nil {
				if errors.Is(err, ErrAssertion) {
					return fmt.Errorf("%w: adding a passkey needs one of yours to approve it: %v", ErrInvalid, err)
				}
				return err
			}
		}
		cred, err := s.wa.CreateCredential(&waUser{name: user}, cer.Create, parsed)
		if err != nil {
			return fmt.Errorf("%w: the registration does not verify: %v", ErrInvalid, describe(err))
		}
		p := Passkey{User: user, CredentialID: cred.ID, PublicKey: cred.PublicKey, SignCount: cred.Authenticator.SignCount,
			AAGUID: cred.Authenticator.AAGUID, Name: name, CreatedAt: now.UTC().Truncate(time.Microsecond)}
		tag, err := tx.Exec(ctx, `INSERT INTO arap.passkeys (credential_id, user_name, public_key, sign_count, aaguid, backup_eligible, name, created_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING`,
			p.CredentialID, user, p.PublicKey, int64(p.SignCount), p.AAGUID, cred.Flags.BackupEligible, name, p.CreatedAt)
		if err != nil {
			return fmt.Errorf("passkeys: store: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("%w: this passkey is already registered", ErrInvalid)
		}
		if err := audit.Append(ctx, tx, audit.Event{Chain: audit.SystemChain, Kind: EventRegistered, Actor: "user:" + user, At: p.CreatedAt,
			Data: registration{User: user, CredentialID: p.CredentialID, PublicKey: p.PublicKey, Fingerprint: p.Fingerprint(),
				AAGUID: hex.EncodeToString(p.AAGUID), Name: name, RPID: s.rpID, Origin: s.origin}}); err != nil {
			return err
		}
		out = &p
		return nil
	})
	return out, err
}

// Decision is a signed decision being made: what the challenge covers.
type Decision struct {
	RequestID   string
	BindingHash string
	Decision    string     // "approve" or "deny"
	Until       *time.Time // the approval window, whole seconds; nil for a deny
}

// BeginDecision starts signing d for user in the session: it fixes the
// ceremony (single use, CeremonyTTL) and returns its id and the options
// for navigator.credentials.get ({"publicKey": ...}), whose challenge is
// Challenge(d) and whose allowCredentials are the user's passkeys.
func (s *Service) BeginDecision(ctx context.Context, session []byte, user string, d Decision) (string, json.RawMessage, error) {
	existing, err := s.List(ctx, user)
	if err != nil {
		return "", nil, err
	}
	if len(existing) == 0 {
		return "", nil, ErrNoPasskey
	}
	challenge := Challenge(d.RequestID, d.BindingHash, d.Decision, d.Until)
	assertion, _, err := s.wa.BeginLogin(&waUser{name: user, creds: credentials(existing)},
		webauthn.WithChallenge(challenge), webauthn.WithUserVerification(protocol.VerificationRequired))
	if err != nil {
		return "", nil, fmt.Errorf("passkeys: begin decision: %w", err)
	}
	id := newCeremonyID()
	if _, err := s.db.Exec(ctx, `INSERT INTO arap.passkey_ceremonies (id, session_hash, user_name, kind, request_id, decision, approved_until, expires_at)
		VALUES ($1, $2, $3, 'decide', $4, $5, $6, $7)`, id, session, user, d.RequestID, d.Decision, d.Until, s.now().Add(CeremonyTTL)); err != nil {
		return "", nil, fmt.Errorf("passkeys: begin decision: %w", err)
	}
	opts, err := json.Marshal(assertion)
	return id, opts, err
}

// TakeDecision ends ceremony id of the session: the decision and window
// fixed when it began, for request requestID. It can be taken once.
func (s *Service) TakeDecision(ctx context.Context, session []byte, user, id, requestID string) (decision string, until *time.Time, err error) {
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		rid, dec, u, _, err := take(ctx, tx, s.now(), id, session, user, "decide")
		if err != nil {
			return err
		}
		if rid == nil || *rid != requestID || dec == nil {
			return ErrCeremony
		}
		decision, until = *dec, u
		return nil
	})
	return decision, until, err
}
