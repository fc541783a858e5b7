// Package webhook signs and verifies ARAP callbacks the Standard Webhooks
// way: webhook-id, webhook-timestamp and webhook-signature headers, the
// signature an HMAC-SHA256 over "id.timestamp.body" with a whsec_ secret.
// The backend signs with it (package callbacks delivers); a PEP verifies
// with Verifier, as middleware around its callback handler, and reads the
// body with ParseBody.
//
// It is a leaf (the standard library, the wire types in authzen and
// internal/clean), so a receiver such as `arapd mcp` links none of the
// backend.
package webhook

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
)

// Standard Webhooks header names.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// SecretPrefix marks a webhook secret.
const SecretPrefix = "whsec_"

// NewSecret returns a fresh secret: whsec_ and 32 random bytes in base64.
func NewSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return SecretPrefix + base64.StdEncoding.EncodeToString(b)
}

// ParseSecret returns the key bytes of a whsec_ secret.
func ParseSecret(s string) ([]byte, error) {
	raw, ok := strings.CutPrefix(s, SecretPrefix)
	if !ok {
		return nil, errors.New("webhook: a webhook secret starts with whsec_")
	}
	key, err := base64.StdEncoding.DecodeString(raw)
	if err != nil || len(key) < 16 {
		return nil, errors.New("webhook: a webhook secret is whsec_ and the base64 of at least 16 bytes")
	}
	return key, nil
}

// Sign returns "v1,<base64 HMAC-SHA256(key, id.timestamp.body)>".
func Sign(key []byte, id string, timestamp int64, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write([]byte(strconv.FormatInt(timestamp, 10)))
	m.Write([]byte{'.'})
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// SignatureHeader signs with every key (two during a rotation),
// space-separated as Standard Webhooks specifies.
func SignatureHeader(keys [][]byte, id string, timestamp int64, body []byte) string {
	sigs := make([]string, len(keys))
	for i, k := range keys {
		sigs[i] = Sign(k, id, timestamp, body)
	}
	return strings.Join(sigs, " ")
}
