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
		"naïve café", "e\u0301", "50,000 €", "a-b_c.d/e:f", "אבג", "مرحبا", "emoji 🙂"} {
		require.True(t, Clean(s), "%q: %+v", s, Scan(s, false))
	}
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
