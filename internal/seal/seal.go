// Package seal encrypts small secrets at rest with AES-256-GCM under a
// master key, binding each to an identifier (the additional data) so a
// sealed value cannot be moved to another row.
//
// A sealed value names the key that sealed it, so that master keys can be
// rotated: a Box seals under its current key and opens under the current
// key or any previous one; Reseal (reseal.go) moves stored values to the
// current key, after which the previous keys can be retired.
//
// Format: 0x01 || key id (8 bytes) || nonce (12) || ciphertext. The key id
// is the first 8 bytes of SHA-256("arap seal key id v1" || key), which says
// which key to use and nothing about the key. Values sealed before key ids
// existed are nonce || ciphertext; they still open (under any of the Box's
// keys), and Reseal converts them.
package seal

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

const (
	version  = 0x01
	idLen    = 8
	idDomain = "arap seal key id v1"
)

type key struct {
	id   [idLen]byte
	aead cipher.AEAD
}

// Box seals with one current master key and opens with it or any previous
// one.
type Box struct {
	current  key
	previous []key
}

// New returns a Box that seals under current and also opens values sealed
// under any of previous (each a 32-byte key).
func New(current []byte, previous ...[]byte) (*Box, error) {
	c, err := newKey(current)
	if err != nil {
		return nil, err
	}
	b := &Box{current: c}
	for i, p := range previous {
		k, err := newKey(p)
		if err != nil {
			return nil, fmt.Errorf("seal: previous key %d: %w", i+1, err)
		}
		if k.id == c.id {
			continue // the current key listed again
		}
		b.previous = append(b.previous, k)
	}
	return b, nil
}

func newKey(master []byte) (key, error) {
	if len(master) != 32 {
		return key{}, fmt.Errorf("seal: master key must be 32 bytes, got %d", len(master))
	}
	block, err := aes.NewCipher(master)
	if err != nil {
		return key{}, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return key{}, err
	}
	k := key{aead: aead}
	copy(k.id[:], keyID(master))
	return k, nil
}

func keyID(master []byte) []byte {
	h := sha256.New()
	h.Write([]byte(idDomain))
	h.Write(master)
	return h.Sum(nil)[:idLen]
}

// KeyID is the hex id a value sealed under master carries, for operators'
// reports.
func KeyID(master []byte) string { return hex.EncodeToString(keyID(master)) }

// CurrentID is the hex id of the current key.
func (b *Box) CurrentID() string { return hex.EncodeToString(b.current.id[:]) }

// Seal encrypts plain for the identifier id under the current key.
func (b *Box) Seal(plain []byte, id string) []byte {
	nonce := make([]byte, b.current.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	out := make([]byte, 0, 1+idLen+len(nonce)+len(plain)+b.current.aead.Overhead())
	out = append(out, version)
	out = append(out, b.current.id[:]...)
	out = append(out, nonce...)
	return b.current.aead.Seal(out, nonce, plain, []byte(id))
}

// ErrOpen means the value was not sealed for id with any of the Box's keys.
var ErrOpen = errors.New("seal: cannot open (wrong master key, or the value belongs to another record)")

// Open decrypts a value sealed for id under any of the Box's keys.
func (b *Box) Open(sealed []byte, id string) ([]byte, error) {
	plain, _, err := b.open(sealed, id)
	return plain, err
}

// Current reports whether sealed is in the current format under the current
// key and opens for id: such a value needs no re-sealing.
func (b *Box) Current(sealed []byte, id string) bool {
	_, cur, err := b.open(sealed, id)
	return err == nil && cur
}

// Reseal returns sealed re-sealed for id under the current key, and whether
// it had to be: a value already sealed under the current key is returned as
// it is.
func (b *Box) Reseal(sealed []byte, id string) ([]byte, bool, error) {
	plain, cur, err := b.open(sealed, id)
	if err != nil {
		return nil, false, err
	}
	if cur {
		return sealed, false, nil
	}
	return b.Seal(plain, id), true, nil
}

// open tries the keyed format when the value names one of the Box's keys,
// else the legacy format under each key: a legacy value's random nonce may
// begin with the version byte and even a key id, so the format is decided by
// authentication, not by the first byte. current is true when the value is
// in the keyed format under the current key.
func (b *Box) open(sealed []byte, id string) (plain []byte, current bool, err error) {
	ad := []byte(id)
	if len(sealed) >= 1+idLen && sealed[0] == version {
		for i, k := range b.keys() {
			if !bytes.Equal(sealed[1:1+idLen], k.id[:]) {
				continue
			}
			if p, err := openRaw(k.aead, sealed[1+idLen:], ad); err == nil {
				return p, i == 0, nil
			}
		}
	}
	for _, k := range b.keys() {
		if p, err := openRaw(k.aead, sealed, ad); err == nil {
			return p, false, nil
		}
	}
	return nil, false, ErrOpen
}

func (b *Box) keys() []key { return append([]key{b.current}, b.previous...) }

// openRaw opens nonce || ciphertext.
func openRaw(aead cipher.AEAD, v, ad []byte) ([]byte, error) {
	n := aead.NonceSize()
	if len(v) < n+aead.Overhead() {
		return nil, ErrOpen
	}
	return aead.Open(nil, v[:n], v[n:], ad)
}

// ParseKeys reads master keys written as base64, separated by commas or
// newlines (the format of the *_MASTER_KEY_PREVIOUS settings); empty input
// is no keys.
func ParseKeys(s string) ([][]byte, error) {
	var out [][]byte
	for i, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == '\n' || r == '\r' }) {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		k, err := base64.StdEncoding.DecodeString(f)
		if err != nil || len(k) != 32 {
			return nil, fmt.Errorf("master key %d of the list is not the base64 encoding of 32 bytes", i+1)
		}
		out = append(out, k)
	}
	return out, nil
}
