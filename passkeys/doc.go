// Package passkeys lets approvers sign decisions with a WebAuthn passkey,
// for the rules that require it (approval.require_passkey): it owns the
// registered credentials (arap.passkeys), the relying party (its id and
// origin come from the backend's public URL), the registration and signing
// ceremonies in progress (arap.passkey_ceremonies), and the challenge a
// signed decision covers.
//
// The challenge is Challenge(request id, binding_hash, decision,
// approved_until): a signature over it covers exactly what will run (the
// binding_hash), on which request, which way, and for how long. Package
// requests recomputes it from the locked request when it records the vote
// and has the assertion verified here (Verify), inside its transaction; the
// vote's audit event carries the assertion.
//
// Registering and removing a passkey are audit events in the system chain
// carrying the credential id, the COSE public key, the relying party id and
// the origin, so that VerifyAudit can check every signed decision from the
// audit log alone, with no access to this package's tables.
package passkeys
