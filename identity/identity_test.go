package identity

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// spellings of bob that must never make him someone else.
var bobs = []string{
	"bob", "BOB", "Bob", " bob", "bob ", "bob\t", "b ob", "b\u200bob", "bob\u200d", "\u202ebob", "bo\u00adb",
	"ｂｏｂ", "\u1d2e\u1d3c\u1d2e", "user:bob", "USER:Bob", "agent:bob", "client:bob", "b\u00a0ob", "bob\u2028",
}

func TestSpellingsOfBobAreBob(t *testing.T) {
	for _, s := range bobs {
		require.True(t, Name("bob").Is(s), "%q", s)
		require.True(t, Name("user:bob").Is(s), "%q", s)
	}
	require.True(t, Name("bob@example.com").Is("BOB@Example.COM"))
	require.True(t, Name("bob@example.com").Is("mailto:bob@example.com"))
	require.True(t, Name("straße").Is("STRASSE"), "full case folding")
	require.True(t, Name("dev-itsm").Is("client:dev-itsm"))
}

func TestOthersAreNotBob(t *testing.T) {
	for _, s := range []string{"bobby", "bo", "alice", "b0b", "bob@example.com", "user:alice", "", ":", "user:", "b\u043eb"} {
		require.False(t, Name("bob").Is(s), "%q", s)
	}
}

func TestOpaqueIdsCompareExactly(t *testing.T) {
	sub := Opaque("AbC123xyz")
	require.True(t, sub.Is("AbC123xyz"))
	require.False(t, sub.Is("abc123xyz"), "case matters in an opaque id space")
	require.False(t, sub.Is("ABC123XYZ"))
	require.True(t, Opaque("YWxpY2U=").Is("YWxpY2U="))
	require.False(t, Opaque("YWxpY2U=").Is("ywxpy2u="))
}

func TestCheck(t *testing.T) {
	for _, ok := range []string{"bob", "BOB", "user:bob", "agent:demo", "bob@example.com", "YWxpY2U=", "AbC123xyz",
		"Zürich", "Bob Smith", "東京", "https://idp.example.com/u/1", "248289761001"} {
		require.NoError(t, Check(ok), "%q", ok)
	}
	bad := map[string]string{
		"":             "is empty",
		" bob":         "whitespace at its start or end",
		"bob ":         "whitespace at its start or end",
		"bob\n":        "whitespace at its start or end",
		"b\u200bob":    "U+200B ZERO WIDTH SPACE (invisible character)",
		"\u202ebob":    "U+202E RIGHT-TO-LEFT OVERRIDE (bidirectional formatting)",
		"b\x00ob":      "U+0000",
		"b\tob":        "U+0009",
		"bo\u00adb":    "U+00AD SOFT HYPHEN",
		"ｂｏｂ":          "not in Unicode NFKC form (U+FF42 FULLWIDTH LATIN SMALL LETTER B)",
		"b\u00a0ob":    "not in Unicode NFKC form (U+00A0 NO-BREAK SPACE)",
		"e\u0301":      "not in Unicode NFKC form",
		"\xffbob":      "not valid UTF-8",
		"b\ue000ob":    "private-use",
		"b\U0003fffdb": "unassigned",
	}
	for in, want := range bad {
		err := Check(in)
		require.Error(t, err, "%q", in)
		require.Contains(t, err.Error(), want, "%q", in)
	}
	long := make([]byte, MaxLen+1)
	for i := range long {
		long[i] = 'a'
	}
	require.ErrorContains(t, Check(string(long)), "longer than")
}

func TestAny(t *testing.T) {
	ids := []ID{Name("bob"), Name("bob@example.com")}
	require.True(t, Any(ids, "BOB@EXAMPLE.COM"))
	require.True(t, Any(ids, "user:Bob"))
	require.False(t, Any(ids, "carol"))
	require.False(t, Any(nil, "bob"))
}

func FuzzIs(f *testing.F) {
	for _, s := range bobs {
		f.Add("bob", s)
	}
	f.Add("AbC", "abc")
	f.Fuzz(func(t *testing.T, known, claimed string) {
		// Is is symmetric for names, and a canonical id is always itself.
		require.Equal(t, Name(known).Is(claimed), Name(claimed).Is(known))
		if Check(claimed) == nil {
			require.True(t, Name(claimed).Is(claimed))
			require.True(t, Opaque(claimed).Is(claimed))
		}
	})
}

func TestNestedTypePrefixes(t *testing.T) {
	require.True(t, Name("bob").Is("agent:user:bob"))
	require.True(t, Name("bob@example.com").Is("agent:mailto:BOB@example.com"))
	require.False(t, Name("bob").Is("agent:user:bobby"))
}
