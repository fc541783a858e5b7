package passkeys

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"time"

	"github.com/go-webauthn/webauthn/protocol"
	"github.com/gowebpki/jcs"
)

// ChallengePurpose separates a decision's challenge from any other use of
// the same key and from later encodings.
const ChallengePurpose = "arap-passkey-decision/v1"

// Challenge is what a signed decision signs: SHA-256 over the RFC 8785
// (JCS) encoding of the object
//
//	{"purpose": "arap-passkey-decision/v1", "request_id": ..., "binding_hash": ...,
//	 "decision": "approve" | "deny", "approved_until": RFC 3339 UTC seconds, or "" for a deny}
//
// approvedUntil is ignored for a deny, and must be a whole second for an
// approve (EncodeUntil).
func Challenge(requestID, bindingHash, decision string, approvedUntil *time.Time) []byte {
	until := ""
	if decision == "approve" && approvedUntil != nil {
		until = EncodeUntil(*approvedUntil)
	}
	raw, err := json.Marshal(map[string]string{
		"purpose": ChallengePurpose, "request_id": requestID, "binding_hash": bindingHash,
		"decision": decision, "approved_until": until,
	})
	if err != nil {
		panic(fmt.Sprintf("passkeys: encode challenge: %v", err)) // strings always encode
	}
	canon, err := jcs.Transform(raw)
	if err != nil {
		panic(fmt.Sprintf("passkeys: canonicalize challenge: %v", err))
	}
	sum := sha256.Sum256(canon)
	return sum[:]
}

// EncodeUntil is how an approval window enters the challenge: RFC 3339 in
// UTC, whole seconds ("2026-11-30T21:00:00Z").
func EncodeUntil(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// Assertion is a WebAuthn assertion (navigator.credentials.get's response)
// as it is stored with a vote: each member base64url without padding.
type Assertion struct {
	CredentialID      protocol.URLEncodedBase64 `json:"credential_id"`
	AuthenticatorData protocol.URLEncodedBase64 `json:"authenticator_data"`
	ClientDataJSON    protocol.URLEncodedBase64 `json:"client_data_json"`
	Signature         protocol.URLEncodedBase64 `json:"signature"`
	UserHandle        protocol.URLEncodedBase64 `json:"user_handle,omitempty"`
}

// Complete reports whether every part a verification needs is present.
func (a *Assertion) Complete() bool {
	return a != nil && len(a.CredentialID) > 0 && len(a.AuthenticatorData) > 0 && len(a.ClientDataJSON) > 0 && len(a.Signature) > 0
}
