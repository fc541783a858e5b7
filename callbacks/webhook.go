// Package callbacks delivers ARAP callbacks: when an access request ends,
// each callback the submitter registered for that event is POSTed, signed
// the Standard Webhooks way (webhook-id, webhook-timestamp, webhook-signature:
// HMAC-SHA256 over "id.timestamp.body" with the client's secret), at least
// once, retried with backoff. The delivery job is enqueued in the
// transaction that ends the request, so a crash cannot lose it.
//
// Callbacks only wake the receiver: the body carries the task handle and
// never the approval, and the status endpoint stays authoritative.
//
// Verifier is the receiving side, for PEPs (our MCP front-end uses it).
package callbacks

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
		return nil, errors.New("callbacks: a webhook secret starts with whsec_")
	}
	key, err := base64.StdEncoding.DecodeString(raw)
	if err != nil || len(key) < 16 {
		return nil, errors.New("callbacks: a webhook secret is whsec_ and the base64 of at least 16 bytes")
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
