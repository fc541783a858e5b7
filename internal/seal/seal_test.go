package seal_test

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/seal"
)

func TestSealOpen(t *testing.T) {
	b, err := seal.New(bytes.Repeat([]byte{1}, 32))
	require.NoError(t, err)
	s := b.Seal([]byte("secret"), "row-1")
	require.NotContains(t, string(s), "secret")
	p, err := b.Open(s, "row-1")
	require.NoError(t, err)
	require.Equal(t, "secret", string(p))
	_, err = b.Open(s, "row-2")
	require.ErrorIs(t, err, seal.ErrOpen, "a sealed value cannot move to another record")
	other, _ := seal.New(bytes.Repeat([]byte{2}, 32))
	_, err = other.Open(s, "row-1")
	require.ErrorIs(t, err, seal.ErrOpen)
	_, err = seal.New([]byte("short"))
	require.Error(t, err)
}

// legacy seals as values were sealed before key ids: nonce || ciphertext.
func legacy(t *testing.T, master, nonce []byte, plain, id string) []byte {
	t.Helper()
	block, err := aes.NewCipher(master)
	require.NoError(t, err)
	aead, err := cipher.NewGCM(block)
	require.NoError(t, err)
	if nonce == nil {
		nonce = make([]byte, aead.NonceSize())
		_, _ = rand.Read(nonce)
	}
	return aead.Seal(append([]byte(nil), nonce...), nonce, []byte(plain), []byte(id))
}

func TestKeyIDsAndRotation(t *testing.T) {
	oldKey, newKey := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	old, err := seal.New(oldKey)
	require.NoError(t, err)
	rotated, err := seal.New(newKey, oldKey)
	require.NoError(t, err)
	onlyNew, err := seal.New(newKey)
	require.NoError(t, err)

	// A value names its key: version byte, then the key id.
	v := old.Seal([]byte("secret"), "row-1")
	require.Equal(t, byte(1), v[0])
	require.Equal(t, seal.KeyID(oldKey), hex.EncodeToString(v[1:9]))
	require.NotEqual(t, seal.KeyID(oldKey), seal.KeyID(newKey))
	require.NotContains(t, hex.EncodeToString(oldKey), seal.KeyID(oldKey), "the id is not a piece of the key")

	// The rotated box opens old values, seals new ones under the new key.
	p, err := rotated.Open(v, "row-1")
	require.NoError(t, err)
	require.Equal(t, "secret", string(p))
	require.False(t, rotated.Current(v, "row-1"))
	w := rotated.Seal([]byte("other"), "row-2")
	require.Equal(t, seal.KeyID(newKey), hex.EncodeToString(w[1:9]))
	require.True(t, rotated.Current(w, "row-2"))
	_, err = old.Open(w, "row-2")
	require.ErrorIs(t, err, seal.ErrOpen, "the old key alone cannot open what the new one sealed")

	// Reseal moves a value to the new key; the new key alone then opens it.
	r, changed, err := rotated.Reseal(v, "row-1")
	require.NoError(t, err)
	require.True(t, changed)
	p, err = onlyNew.Open(r, "row-1")
	require.NoError(t, err)
	require.Equal(t, "secret", string(p))
	_, err = onlyNew.Open(v, "row-1")
	require.ErrorIs(t, err, seal.ErrOpen, "once retired, the old key's values no longer open")
	same, changed, err := rotated.Reseal(r, "row-1")
	require.NoError(t, err)
	require.False(t, changed, "a value under the current key is left as it is")
	require.Equal(t, r, same)
	_, _, err = rotated.Reseal(r, "row-9")
	require.ErrorIs(t, err, seal.ErrOpen, "the additional data still binds the row")

	// The key id is part of the value: one altered does not open, under
	// the key it named or any other, so a value cannot pass for another
	// key's (which keys reseal --check relies on).
	for i := 1; i < 9; i++ {
		bad := bytes.Clone(w)
		bad[i] ^= 0x01
		_, err = rotated.Open(bad, "row-2")
		require.ErrorIs(t, err, seal.ErrOpen, "key id byte %d altered", i)
	}

	_, err = seal.New(newKey, []byte("short"))
	require.Error(t, err)
}

func TestLegacyValuesOpen(t *testing.T) {
	oldKey, newKey := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	rotated, err := seal.New(newKey, oldKey)
	require.NoError(t, err)
	id := func(k []byte) []byte { b, _ := hex.DecodeString(seal.KeyID(k)); return b }
	for name, nonce := range map[string][]byte{
		"random nonce": nil,
		// A legacy nonce that reads as the keyed format under either key:
		// authentication, not the first bytes, decides the format.
		"nonce looks keyed (current)":  append(append([]byte{1}, id(newKey)...), 7, 7, 7),
		"nonce looks keyed (previous)": append(append([]byte{1}, id(oldKey)...), 7, 7, 7),
	} {
		t.Run(name, func(t *testing.T) {
			for _, k := range [][]byte{oldKey, newKey} {
				v := legacy(t, k, nonce, "secret", "row-1")
				p, err := rotated.Open(v, "row-1")
				require.NoError(t, err)
				require.Equal(t, "secret", string(p))
				require.False(t, rotated.Current(v, "row-1"), "a legacy value is never current: re-seal converts it")
				r, changed, err := rotated.Reseal(v, "row-1")
				require.NoError(t, err)
				require.True(t, changed)
				require.True(t, rotated.Current(r, "row-1"))
				_, err = rotated.Open(v, "row-2")
				require.ErrorIs(t, err, seal.ErrOpen)
			}
		})
	}
}
