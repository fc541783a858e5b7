// Package randid makes and recognises the backend's random ids: a type
// prefix ("arq_", "apr_", "msg_") and crypto/rand.Text (base32, 128 bits).
// An id that arrives from outside is checked with Valid before it reaches a
// query, so a malformed one is simply unknown, and text PostgreSQL refuses
// (NUL, invalid UTF-8) never reaches it.
package randid

import (
	"crypto/rand"
	"strings"
)

// New returns a fresh id with prefix.
func New(prefix string) string { return prefix + rand.Text() }

// Valid reports whether id has the form New(prefix) gives: prefix, then
// 16 to 64 characters of the base32 alphabet.
func Valid(prefix, id string) bool {
	rest, ok := strings.CutPrefix(id, prefix)
	if !ok || len(rest) < 16 || len(rest) > 64 {
		return false
	}
	for i := 0; i < len(rest); i++ {
		if c := rest[i]; !('A' <= c && c <= 'Z' || '2' <= c && c <= '7') {
			return false
		}
	}
	return true
}
