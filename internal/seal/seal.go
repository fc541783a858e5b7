// Package seal encrypts small secrets at rest with AES-256-GCM under a
// master key, binding each to an identifier (the additional data) so a
// sealed value cannot be moved to another row.
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
)

// Box seals and opens with one master key.
type Box struct{ aead cipher.AEAD }

// New returns a Box for a 32-byte master key.
func New(master []byte) (*Box, error) {
	if len(master) != 32 {
		return nil, fmt.Errorf("seal: master key must be 32 bytes, got %d", len(master))
	}
	block, err := aes.NewCipher(master)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Box{aead: aead}, nil
}

// Seal encrypts plain for the identifier id: nonce || ciphertext.
func (b *Box) Seal(plain []byte, id string) []byte {
	nonce := make([]byte, b.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return b.aead.Seal(nonce, nonce, plain, []byte(id))
}

// ErrOpen means the value was not sealed for id with this master key.
var ErrOpen = errors.New("seal: cannot open (wrong master key, or the value belongs to another record)")

// Open decrypts a value sealed for id.
func (b *Box) Open(sealed []byte, id string) ([]byte, error) {
	n := b.aead.NonceSize()
	if len(sealed) < n {
		return nil, ErrOpen
	}
	plain, err := b.aead.Open(nil, sealed[:n], sealed[n:], []byte(id))
	if err != nil {
		return nil, ErrOpen
	}
	return plain, nil
}
