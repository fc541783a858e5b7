package randid_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/randid"
)

func TestNewIsValid(t *testing.T) {
	for _, p := range []string{"arq_", "apr_", "msg_"} {
		id := randid.New(p)
		require.True(t, randid.Valid(p, id), id)
		require.False(t, randid.Valid("apr_x", id))
	}
}

// FuzzValid checks Valid against an independent oracle (a regular
// expression): the ids it admits, and only those, are the prefix and 16 to
// 64 base32 characters, so they are safe to put in a query.
func FuzzValid(f *testing.F) {
	for _, id := range []string{randid.New("arq_"), "arq_" + strings.Repeat("A", 16), "arq_" + strings.Repeat("7", 64),
		"arq_" + strings.Repeat("A", 65), "arq_" + strings.Repeat("A", 15), "arq_", "", "arq_\x00AAAAAAAAAAAAAAAAAAAAAAAA",
		"arq_AAAAAAAAAAAAAAAAAAAAAAAAA\xff", "arq_aaaaaaaaaaaaaaaaaaaaaaaaaa", "apr_AAAAAAAAAAAAAAAAAAAAAAAAAA", "arq_18AAAAAAAAAAAAAAAAAAAAAAAA"} {
		f.Add("arq_", id)
	}
	f.Add("", "AAAAAAAAAAAAAAAA")
	rest := regexp.MustCompile(`^[A-Z2-7]{16,64}$`)
	f.Fuzz(func(t *testing.T, prefix, id string) {
		if !strings.HasPrefix(id, prefix) {
			require.False(t, randid.Valid(prefix, id))
			return
		}
		require.Equal(t, rest.MatchString(id[len(prefix):]), randid.Valid(prefix, id), "Valid(%q, %q)", prefix, id)
	})
}
