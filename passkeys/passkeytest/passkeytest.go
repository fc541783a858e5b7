// Package passkeytest is a software WebAuthn authenticator for tests that
// need real registrations and assertions without a browser: a P-256 key,
// "none" attestation, and assertions built and signed as an authenticator
// would (authenticatorData, clientDataJSON, ECDSA over authenticatorData ||
// SHA-256(clientDataJSON)). Browser tests use Chromium's virtual
// authenticator instead.
package passkeytest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/go-webauthn/webauthn/protocol/webauthncbor"
	"github.com/go-webauthn/webauthn/protocol/webauthncose"

	"github.com/omcp/arap/passkeys"
)

// Authenticator is one passkey.
type Authenticator struct {
	Key    *ecdsa.PrivateKey
	ID     []byte
	RPID   string
	Origin string
	Count  uint32
}

// New returns an authenticator for the relying party rpID at origin.
func New(rpID, origin string) *Authenticator {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	return &Authenticator{Key: k, ID: id, RPID: rpID, Origin: origin}
}

// COSE is the public key as a COSE_Key.
func (a *Authenticator) COSE() []byte {
	pub, err := a.Key.PublicKey.ECDH()
	if err != nil {
		panic(err)
	}
	raw := pub.Bytes() // 0x04 || X || Y
	b, err := webauthncbor.Marshal(webauthncose.EC2PublicKeyData{
		PublicKeyData: webauthncose.PublicKeyData{KeyType: int64(webauthncose.EllipticKey), Algorithm: int64(webauthncose.AlgES256)},
		Curve:         1, XCoord: raw[1:33], YCoord: raw[33:],
	})
	if err != nil {
		panic(err)
	}
	return b
}

func (a *Authenticator) authData(flags byte, attested []byte) []byte {
	rp := sha256.Sum256([]byte(a.RPID))
	a.Count++
	out := slices.Concat(rp[:], []byte{flags}, binary.BigEndian.AppendUint32(nil, a.Count))
	return append(out, attested...)
}

// Register answers navigator.credentials.create's options (as the server
// sent them, {"publicKey": ...}) with the PublicKeyCredential JSON.
func (a *Authenticator) Register(options []byte) []byte {
	var o struct {
		PublicKey struct {
			Challenge string `json:"challenge"`
		} `json:"publicKey"`
	}
	if err := json.Unmarshal(options, &o); err != nil {
		panic(fmt.Sprintf("passkeytest: options: %v", err))
	}
	attested := slices.Concat(make([]byte, 16), binary.BigEndian.AppendUint16(nil, uint16(len(a.ID))), a.ID, a.COSE())
	ad := a.authData(0x45, attested) // UP, UV, AT
	att, err := webauthncbor.Marshal(map[string]any{"fmt": "none", "attStmt": map[string]any{}, "authData": ad})
	if err != nil {
		panic(err)
	}
	cd, _ := json.Marshal(map[string]any{"type": "webauthn.create", "challenge": o.PublicKey.Challenge, "origin": a.Origin})
	b64 := base64.RawURLEncoding.EncodeToString
	body, _ := json.Marshal(map[string]any{
		"id": b64(a.ID), "rawId": b64(a.ID), "type": "public-key",
		"response":               map[string]any{"attestationObject": b64(att), "clientDataJSON": b64(cd)},
		"clientExtensionResults": map[string]any{},
	})
	return body
}

// Sign returns the assertion of challenge: user present and verified.
func (a *Authenticator) Sign(challenge []byte) *passkeys.Assertion {
	return a.SignAs(challenge, "webauthn.get", a.Origin, 0x05)
}

// SignAs is Sign with the client data's type and origin and the flags of
// the caller's choosing, for tests of what a verifier must refuse.
func (a *Authenticator) SignAs(challenge []byte, typ, origin string, flags byte) *passkeys.Assertion {
	ad := a.authData(flags, nil)
	cd, _ := json.Marshal(map[string]any{"type": typ, "challenge": base64.RawURLEncoding.EncodeToString(challenge), "origin": origin})
	h := sha256.Sum256(cd)
	d := sha256.Sum256(slices.Concat(ad, h[:]))
	sig, err := ecdsa.SignASN1(rand.Reader, a.Key, d[:])
	if err != nil {
		panic(err)
	}
	return &passkeys.Assertion{CredentialID: a.ID, AuthenticatorData: ad, ClientDataJSON: cd, Signature: sig}
}
