package visible

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestScanFindsEveryHiddenClass(t *testing.T) {
	cases := []struct {
		in   string
		code string
		why  string
	}{
		{"acct-\u202e199", "U+202E", Bidi},
		{"acct-199\u202c", "U+202C", Bidi},
		{"a\u2066b", "U+2066", Bidi},
		{"a\u2069b", "U+2069", Bidi},
		{"a\u202ab", "U+202A", Bidi},
		{"a\u200eb", "U+200E", Bidi},
		{"a\u061cb", "U+061C", Bidi},
		{"ac\u200bct", "U+200B", Invisible},
		{"a\u200db", "U+200D", Invisible},
		{"a\u2060b", "U+2060", Invisible},
		{"a\ufeffb", "U+FEFF", Invisible},
		{"a\u00adb", "U+00AD", Invisible},
		{"a\u034fb", "U+034F", Invisible},
		{"a\ufe0fb", "U+FE0F", Invisible},
		{"a\U000e0041b", "U+E0041", Invisible},
		{"a\u3164b", "U+3164", Invisible},
		{"a\x00b", "U+0000", Control},
		{"a\tb", "U+0009", Control},
		{"a\nb", "U+000A", Control},
		{"a\x1bb", "U+001B", Control},
		{"a\u0085b", "U+0085", Control},
		{"a\u2028b", "U+2028", Control},
		{"a\u00a0b", "U+00A0", SpaceLike},
		{"a\u3000b", "U+3000", SpaceLike},
		{"a\ue000b", "U+E000", PrivateUse},
		{"a\U000f0000b", "U+F0000", PrivateUse},
		{"a\U000e0080b", "U+E0080", Invisible},
		{"a\U0003fffdb", "U+3FFFD", Unassigned},
		{"a\u0378b", "U+0378", Unassigned},
		{"a\xffb", "0xFF", InvalidUTF8},
		{"p\u0430ypal", "U+0430", MixedScript},
		{"\u0440aypal", "U+0440", MixedScript},
		{"\uff41cct", "U+FF41", Compatibility},    // fullwidth a
		{"acct\uff0d1", "U+FF0D", Compatibility},  // fullwidth hyphen-minus
		{"acct-\uff11", "U+FF11", Compatibility},  // fullwidth digit one
		{"m\u00b2", "U+00B2", Compatibility},      // superscript two
		{"\ufb01le", "U+FB01", Compatibility},     // ligature fi
		{"\u2460", "U+2460", Compatibility},       // circled digit one
		{"\U0001d41a", "U+1D41A", Compatibility},  // mathematical bold a
		{"10\u2126", "U+2126", Compatibility},     // ohm sign (canonically omega)
		{"\u212b", "U+212B", Compatibility},       // angstrom sign
		{"\uff71", "U+FF71", Compatibility},       // halfwidth katakana a
		{"a\u0340", "U+0340", Compatibility},      // a combining mark NFKC replaces
		{"\u1e9b\u0323", "U+1E9B", Compatibility}, // long s with dot above, then a mark
	}
	for _, c := range cases {
		fs := Scan(c.in, false)
		require.Len(t, fs, 1, "%q: %+v", c.in, fs)
		require.Equal(t, c.code, fs[0].Code, "%q", c.in)
		require.Equal(t, c.why, fs[0].Why, "%q", c.in)
		require.Equal(t, c.in[fs[0].Offset:fs[0].Offset+fs[0].Size], string([]byte(c.in)[fs[0].Offset:fs[0].Offset+fs[0].Size]))
		require.False(t, Clean(c.in))
	}
}

func TestPlainTextIsClean(t *testing.T) {
	for _, s := range []string{"", "acct-991", "Zürich", "ÅngströM", "Москва", "Αθήνα", "東京タワー", "ラーメン", "Tokyo 東京", "서울",
		"naïve café", "e\u0301", "50,000 €", "日本語のテキスト、全角句読点。", "Ελληνικά", "Straße", "Ørsted", "a-b_c.d/e:f", "אבג", "مرحبا", "emoji 🙂"} {
		require.True(t, Clean(s), "%q: %+v", s, Scan(s, false))
	}
}

// TestPrintableASCIIShortcut: Clean and Hidden answer printable ASCII
// without the Unicode tables (a policy's hidden_characters() reads every
// argument of every call); Scan, which has no shortcut, agrees, and a
// control character beside printable ones is still found.
func TestPrintableASCIIShortcut(t *testing.T) {
	var all []byte
	for c := byte(' '); c <= '~'; c++ {
		all = append(all, c)
		_, hidden := Hidden(rune(c))
		require.False(t, hidden, "%q", c)
		require.Empty(t, Scan(string(c), false), "%q", c)
	}
	require.True(t, Clean(string(all)))
	require.Empty(t, Scan(string(all), false))
	for _, c := range []byte{0, '\t', '\n', 0x1b, 0x7f, 0x80, 0xff} {
		require.False(t, Clean(string(all)+string([]byte{c})), "%q", c)
		_, hidden := Hidden(rune(c))
		require.Equal(t, c != 0xff, hidden, "%q", c) // as runes, 0x80 is a C1 control and 0xff is ÿ
	}
}

// TestCompatibilityPerCharacter: each character is compared with its own
// NFKC form, so a combining sequence neither hides a compatibility character
// nor makes ordinary decomposed text one; the finding names the NFKC form.
func TestCompatibilityPerCharacter(t *testing.T) {
	fs := Scan("\uff43\uff0d\uff11\uff12\uff13", false)
	require.Len(t, fs, 5)
	for i, f := range fs {
		require.Equal(t, Compatibility, f.Why)
		require.Equal(t, 3*i, f.Offset)
		require.Equal(t, 3, f.Size)
	}
	require.Equal(t, "U+FF43 FULLWIDTH LATIN SMALL LETTER C (NFKC “c”)", fs[0].Label())
	require.Equal(t, "<U+FF43><U+FF0D><U+FF11><U+FF12><U+FF13>", Marked("\uff43\uff0d\uff11\uff12\uff13", false))

	// A compatibility character before combining marks is found, and only it.
	fs = Scan("\uff41\u0301\u0323x", false)
	require.Len(t, fs, 1)
	require.Equal(t, "U+FF41", fs[0].Code)
	// Decomposed accents compose under NFKC (and NFC) but are no
	// compatibility characters; neither are their composed forms.
	for _, s := range []string{"e\u0301", "\u00e9", "a\u0308\u0301", "\u1100\u1161\u11a8", "\uac01", "\u30ac", "\u30ab\u3099"} {
		require.True(t, Clean(s), "%q: %+v", s, Scan(s, false))
	}
	// An NFKC form that could be missed is written as code points.
	fs = Scan("\u00a8", false) // DIAERESIS: NFKC is a space and a combining mark
	require.Len(t, fs, 1)
	require.Equal(t, "DIAERESIS (NFKC U+0020 U+0308)", fs[0].Name)
	require.Equal(t, "TRADE MARK SIGN (NFKC “TM”)", Scan("\u2122", false)[0].Name)
	// A character another class reports keeps that reason.
	fs = Scan("a\u00a0b", false)
	require.Len(t, fs, 1)
	require.Equal(t, SpaceLike, fs[0].Why)
}

func TestMultilineKeepsLineBreaks(t *testing.T) {
	require.Empty(t, Scan("one\ntwo\r\nthree", true))
	require.Len(t, Scan("one\ntwo", false), 1)
	require.Len(t, Scan("one\rtwo", true), 1, "a lone CR is not a line break")
}

func TestSegmentsRoundTrip(t *testing.T) {
	in := "acct-\u202e199\u202c and p\u0430y \xff"
	var got string
	markers := 0
	for _, s := range Segments(in, false) {
		got += s.Text
		if s.Marker != nil {
			markers++
			require.Equal(t, s.Text, in[s.Marker.Offset:s.Marker.Offset+s.Marker.Size])
		}
	}
	require.Equal(t, in, got)
	require.Equal(t, 4, markers)
	require.Equal(t, "U+202E RIGHT-TO-LEFT OVERRIDE", Scan(in, false)[0].Label())
}

func FuzzScan(f *testing.F) {
	for _, s := range []string{"acct-\u202e199\u202c", "p\u0430ypal", "\xff\xfe", "a\u200bb", "東京tokyo", "plain"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var got string
		last := -1
		for _, seg := range Segments(s, false) {
			got += seg.Text
			if seg.Marker != nil {
				require.Greater(t, seg.Marker.Offset, last)
				last = seg.Marker.Offset
			}
		}
		require.Equal(t, s, got, "segments must cover the text exactly")
	})
}

func TestMarkedReplacesEveryFindingWithItsCode(t *testing.T) {
	require.Equal(t, "acct-<U+202E>199<U+202C>", Marked("acct-\u202e199\u202c", false))
	require.Equal(t, "p<U+0430>ypal and <0xFF>", Marked("p\u0430ypal and \xff", false))
	require.Equal(t, "plain text", Marked("plain text", false))
	require.Equal(t, "one\ntwo", Marked("one\ntwo", true))
	require.Equal(t, "one<U+000A>two", Marked("one\ntwo", false))
	for _, c := range []string{"a\u202eb", "a\u200bb", "a\x1bb", "\ue000"} {
		require.True(t, Clean(Marked(c, false)), "%q: markers are plain text", c)
	}
}

type named map[string]any

func TestScanValueWalksNamesValuesAndNesting(t *testing.T) {
	v := named{
		"to":         "acct-\u202e199\u202c",
		"amount":     50000.0,
		"n\u200bame": "clean",
		"list":       []any{"ok", map[string]any{"deep": "p\u0430y"}},
		"nothing":    nil,
		"a/b~c":      "x\u2066",
	}
	got := ScanValue(v)
	type row struct {
		ptr    string
		inName bool
		code   string
	}
	var rows []row
	for _, l := range got {
		rows = append(rows, row{l.Pointer("/args"), l.InName, l.Code})
	}
	require.Equal(t, []row{
		{"/args/a~1b~0c", false, "U+2066"},
		{"/args/list/1/deep", false, "U+0430"},
		{"/args/n\u200bame", true, "U+200B"},
		{"/args/to", false, "U+202E"},
		{"/args/to", false, "U+202C"},
	}, rows)
	require.Empty(t, ScanValue(map[string]any{"to": "acct-991", "amount": 1.0, "b": true, "l": []any{"Zürich"}}))
	require.Empty(t, ScanValue(nil))
}

func TestScanValueReportsWhatIsTooDeepToCheck(t *testing.T) {
	var v any = "clean"
	for i := 0; i < 100; i++ {
		v = []any{v}
	}
	got := ScanValue(v)
	require.Len(t, got, 1)
	require.Equal(t, TooDeep, got[0].Finding)
}
