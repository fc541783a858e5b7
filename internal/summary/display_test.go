package summary

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCompatibilityCharacters (issue 39): a character whose NFKC form
// differs from it is marked by Show and Plain and noted for the warning,
// in a value and in a member name; ordinary text is neither.
func TestCompatibilityCharacters(t *testing.T) {
	require.Equal(t, `<bdi class="val">acct-<mark class="hidden-char" title="U+FF11 FULLWIDTH DIGIT ONE (NFKC “1”): compatibility character">U+FF11</mark></bdi>`,
		string(Show("acct-\uff11")))
	require.Equal(t, "<U+FF43><U+FF0D>123", Plain("\uff43\uff0d123"))
	require.Equal(t, "m<U+00B2>\n<U+FB01>le", PlainBlock("m\u00b2\n\ufb01le"))
	require.Equal(t, "東京タワー、Zürich café e\u0301", Plain("東京タワー、Zürich café e\u0301"))

	var n Notes
	n.Value("argument", map[string]any{"\uff54o": "\uff11\uff11", "memo": "東京タワー"})
	n.Text("the tool", "wire\uff3ftransfer")
	var got []string
	for _, x := range n.List {
		got = append(got, x.Finding.Label()+" in "+x.Where)
		require.Equal(t, "compatibility character", x.Finding.Why)
	}
	require.Equal(t, []string{
		"U+FF54 FULLWIDTH LATIN SMALL LETTER T (NFKC “t”) in argument “ｔo” (in its name)",
		"U+FF11 FULLWIDTH DIGIT ONE (NFKC “1”) in argument “ｔo”",
		"U+FF3F FULLWIDTH LOW LINE (NFKC “_”) in the tool",
	}, got)
	require.Equal(t, 2, n.List[1].Count)
}
