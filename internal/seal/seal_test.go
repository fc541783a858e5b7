package seal_test

import (
	"bytes"
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
