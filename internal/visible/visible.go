// Package visible finds the characters of a text that a person reading it
// could not see, or could take for others: controls, bidirectional
// formatting, zero-width and other default-ignorable code points, private-use
// and unassigned code points, space look-alikes, bytes that are not UTF-8,
// letters of another script inside a word (a Cyrillic "а" in "pаypal"), and
// compatibility characters: every character whose NFKC form is not itself
// (fullwidth "ａ", superscript "²", the ligature "ﬁ", circled "①"), which
// looks like another character or string but is not it.
//
// An approver must read exactly what will run, so everything that shows a
// request to a person (the web UI today; e-mail and chat later) renders these
// as labelled markers, and policy can refuse them outright.
package visible

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
	"golang.org/x/text/unicode/runenames"
)

// Reasons a character is reported.
const (
	Control     = "control character"
	Bidi        = "bidirectional formatting"
	Invisible   = "invisible character"
	PrivateUse  = "private-use character"
	Unassigned  = "unassigned code point"
	SpaceLike   = "space other than U+0020"
	InvalidUTF8 = "byte that is not UTF-8"
	MixedScript = "letter of another script"
	// Compatibility: a character NFKC replaces (UAX #15), such as fullwidth
	// "ａ" for "a".
	Compatibility = "compatibility character"
	markerPrefix  = "U+"
)

// Finding is one character a person could not see or could mistake.
type Finding struct {
	// Offset is the byte offset in the scanned string.
	Offset int `json:"offset"`
	// Size is the length in bytes (1 for a byte that is not UTF-8).
	Size int `json:"size"`
	// Rune is the code point (utf8.RuneError for a byte that is not UTF-8).
	Rune rune `json:"rune"`
	// Code is "U+202E", or "0xFF" for a byte that is not UTF-8.
	Code string `json:"code"`
	// Name is the Unicode character name, or a description.
	Name string `json:"name"`
	// Why is one of the reasons above.
	Why string `json:"why"`
}

// Label is how a marker reads: "U+202E RIGHT-TO-LEFT OVERRIDE".
func (f Finding) Label() string {
	if f.Name == "" {
		return f.Code
	}
	return f.Code + " " + f.Name
}

// bidi are the explicit directional formatting characters (UAX #9):
// embeddings, overrides, isolates and marks.
var bidi = &unicode.RangeTable{R16: []unicode.Range16{
	{Lo: 0x061c, Hi: 0x061c, Stride: 1}, // ARABIC LETTER MARK
	{Lo: 0x200e, Hi: 0x200f, Stride: 1}, // LRM, RLM
	{Lo: 0x202a, Hi: 0x202e, Stride: 1}, // LRE, RLE, PDF, LRO, RLO
	{Lo: 0x2066, Hi: 0x2069, Stride: 1}, // LRI, RLI, FSI, PDI
}}

// Hidden reports whether r, on its own, is not plainly visible, and why.
// Newline is hidden too: callers that show multi-line text skip it.
func Hidden(r rune) (string, bool) {
	switch {
	case ' ' <= r && r <= '~':
		return "", false // printable ASCII, the common case, in no table below
	case r == utf8.RuneError:
		return "", false // U+FFFD itself shows; invalid bytes are found by Scan
	case unicode.Is(bidi, r):
		return Bidi, true
	case unicode.IsControl(r):
		return Control, true
	case unicode.Is(unicode.Cf, r), unicode.Is(unicode.Other_Default_Ignorable_Code_Point, r),
		unicode.Is(unicode.Variation_Selector, r):
		return Invisible, true
	case unicode.Is(unicode.Zl, r), unicode.Is(unicode.Zp, r):
		return Control, true
	case unicode.Is(unicode.Zs, r) && r != ' ':
		return SpaceLike, true
	case unicode.Is(unicode.Co, r) || unicode.Is(unicode.Cs, r):
		return PrivateUse, true
	case unicode.Is(unicode.Cn, r):
		return Unassigned, true
	}
	return "", false
}

// Scan lists every character of s a person could not see or could mistake,
// in order. With multiline, newlines (and a CR before one) count as visible:
// the caller shows line breaks.
func Scan(s string, multiline bool) []Finding {
	var out []Finding
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			out = append(out, Finding{Offset: i, Size: 1, Rune: r, Code: fmt.Sprintf("0x%02X", s[i]), Name: "not UTF-8", Why: InvalidUTF8})
		case multiline && (r == '\n' || (r == '\r' && strings.HasPrefix(s[i+1:], "\n"))):
		default:
			if why, hidden := Hidden(r); hidden {
				out = append(out, finding(i, size, r, why))
			}
		}
		i += size
	}
	return merge(merge(out, mixedScript(s)), compatibility(s))
}

// compatibility reports every character whose NFKC form differs from it.
// Each character is normalized on its own, never the text around it: the
// composition of a base letter with the combining marks after it ("e" and
// U+0301) is canonical and changes nothing a reader sees, while a
// compatibility character is found wherever it stands, before a combining
// mark or as one (U+0340).
func compatibility(s string) []Finding {
	var out []Finding
	for i, r := range s {
		if r < utf8.RuneSelf || r == utf8.RuneError {
			continue // ASCII is its own NFKC form; invalid bytes are found by Scan
		}
		c := string(r)
		nf := norm.NFKC.String(c)
		if nf == c {
			continue
		}
		f := finding(i, len(c), r, Compatibility)
		f.Name += " (NFKC " + readable(nf) + ")"
		out = append(out, f)
	}
	return out
}

// readable writes an NFKC form for a finding's name: quoted as it is when
// nothing in it could be missed, otherwise as code points ("U+0020 U+0308"
// for the spacing diaeresis).
func readable(nf string) string {
	plain := len(Scan(nf, false)) == 0 // nf is NFKC: this does not recurse further
	for _, r := range nf {
		plain = plain && unicode.IsGraphic(r) && !unicode.IsMark(r) && !unicode.IsSpace(r)
	}
	if plain {
		return "“" + nf + "”"
	}
	codes := make([]string, 0, len(nf))
	for _, r := range nf {
		codes = append(codes, fmt.Sprintf("%s%04X", markerPrefix, r))
	}
	return strings.Join(codes, " ")
}

func finding(offset, size int, r rune, why string) Finding {
	return Finding{Offset: offset, Size: size, Rune: r, Code: fmt.Sprintf("%s%04X", markerPrefix, r), Name: runenames.Name(r), Why: why}
}

// Clean reports whether s has nothing Scan would report. Printable ASCII
// has nothing: no control, one script, each character its own NFKC form.
func Clean(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return len(Scan(s, false)) == 0
		}
	}
	return true
}

// Segment is a piece of a text as shown: plain text, or one marker.
type Segment struct {
	Text   string
	Marker *Finding
}

// Segments splits s into plain runs and markers, for rendering.
func Segments(s string, multiline bool) []Segment {
	fs := Scan(s, multiline)
	if len(fs) == 0 {
		return []Segment{{Text: s}}
	}
	var out []Segment
	at := 0
	for i := range fs {
		f := fs[i]
		if f.Offset > at {
			out = append(out, Segment{Text: s[at:f.Offset]})
		}
		out = append(out, Segment{Text: s[f.Offset : f.Offset+f.Size], Marker: &fs[i]})
		at = f.Offset + f.Size
	}
	if at < len(s) {
		out = append(out, Segment{Text: s[at:]})
	}
	return out
}

// merge joins two offset-ordered lists; a character found by both is
// reported once, with the first list's reason.
func merge(a, b []Finding) []Finding {
	if len(b) == 0 {
		return a
	}
	out := make([]Finding, 0, len(a)+len(b))
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i].Offset < b[j].Offset):
			out = append(out, a[i])
			i++
		case i == len(a) || b[j].Offset < a[i].Offset:
			out = append(out, b[j])
			j++
		default:
			out = append(out, a[i])
			i, j = i+1, j+1
		}
	}
	return out
}

// scripts are the common scripts, tried first; any other is found in
// unicode.Scripts.
var scripts = []struct {
	name  string
	table *unicode.RangeTable
}{
	{"Latin", unicode.Latin}, {"Cyrillic", unicode.Cyrillic}, {"Greek", unicode.Greek},
	{"Armenian", unicode.Armenian}, {"Cherokee", unicode.Cherokee}, {"Georgian", unicode.Georgian},
	{"Coptic", unicode.Coptic}, {"Hebrew", unicode.Hebrew}, {"Arabic", unicode.Arabic},
	{"Han", unicode.Han}, {"Hiragana", unicode.Hiragana}, {"Katakana", unicode.Katakana},
	{"Hangul", unicode.Hangul}, {"Bopomofo", unicode.Bopomofo}, {"Thai", unicode.Thai},
	{"Devanagari", unicode.Devanagari}, {"Lisu", unicode.Lisu}, {"Tifinagh", unicode.Tifinagh},
}

// scriptOf is r's script, or "" for letters every script shares (Common,
// Inherited: the kana prolonged sound mark, for one).
func scriptOf(r rune) string {
	for _, s := range scripts {
		if unicode.Is(s.table, r) {
			return s.name
		}
	}
	if unicode.Is(unicode.Common, r) || unicode.Is(unicode.Inherited, r) {
		return ""
	}
	for name, table := range unicode.Scripts {
		if unicode.Is(table, r) {
			return name
		}
	}
	return ""
}

// cjk lists the script sets that mix legitimately in one word (UTS #39,
// "highly restrictive"): Latin with Han and Japanese kana, Han with
// Bopomofo, Han with Hangul.
var cjk = []map[string]bool{
	{"Latin": true, "Han": true, "Hiragana": true, "Katakana": true},
	{"Latin": true, "Han": true, "Bopomofo": true},
	{"Latin": true, "Han": true, "Hangul": true},
}

// mixedScript reports, in each word (a run of letters, marks and digits)
// whose letters come from more than one script, the letters outside the
// word's main script: the look-alikes a homograph attack is made of.
func mixedScript(s string) []Finding {
	var out []Finding
	type letter struct {
		offset, size int
		r            rune
		script       string
	}
	var word []letter
	flush := func() {
		count := map[string]int{}
		for _, l := range word {
			count[l.script]++
		}
		if len(count) > 1 && !allowedMix(count) {
			main := ""
			for _, l := range word { // most letters wins; Latin on a tie
				if c := count[l.script]; main == "" || c > count[main] || (c == count[main] && l.script == "Latin") {
					main = l.script
				}
			}
			for _, l := range word {
				if l.script != main {
					f := finding(l.offset, l.size, l.r, MixedScript)
					f.Name += " (" + l.script + " in a " + main + " word)"
					out = append(out, f)
				}
			}
		}
		word = word[:0]
	}
	for i, r := range s {
		switch {
		case unicode.IsLetter(r):
			if sc := scriptOf(r); sc != "" {
				word = append(word, letter{i, utf8.RuneLen(r), r, sc})
			}
		case unicode.IsMark(r) || unicode.IsDigit(r):
		default:
			flush()
		}
	}
	flush()
	return out
}

func allowedMix(count map[string]int) bool {
	for _, set := range cjk {
		ok := true
		for sc := range count {
			ok = ok && set[sc]
		}
		if ok {
			return true
		}
	}
	return false
}

// Marked is s with every finding replaced by a text marker, "<U+202E>", for
// places that show plain text (a terminal, an HTML attribute, a page title).
// The characters themselves are left out, so none can reorder or hide what
// follows.
func Marked(s string, multiline bool) string {
	fs := Scan(s, multiline)
	if len(fs) == 0 {
		return s
	}
	var b strings.Builder
	at := 0
	for _, f := range fs {
		b.WriteString(s[at:f.Offset])
		b.WriteString("<" + f.Code + ">")
		at = f.Offset + f.Size
	}
	b.WriteString(s[at:])
	return b.String()
}

// Located is a finding inside a JSON-like value.
type Located struct {
	// Path leads from the scanned value to the string: member names and
	// list indices ("3").
	Path []string `json:"-"`
	// InName is true when the finding is in the member name Path[len-1]
	// rather than in the string value there.
	InName bool `json:"in_name,omitempty"`
	Finding
}

// Pointer is the RFC 6901 JSON Pointer of Path under prefix.
func (l Located) Pointer(prefix string) string {
	var b strings.Builder
	b.WriteString(prefix)
	for _, p := range l.Path {
		b.WriteByte('/')
		b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(p))
	}
	return b.String()
}

// maxDepth bounds the walk; anything deeper is reported as one finding, since
// what cannot be checked cannot be called clean.
const maxDepth = 64

// ScanValue finds hidden characters in every string of v and in every member
// name: v is what encoding/json produces (maps with string keys, slices,
// strings, numbers, booleans, nil), or a named type of those. Members are
// visited in name order.
func ScanValue(v any) []Located {
	var out []Located
	walkValue(reflect.ValueOf(v), nil, 0, &out)
	return out
}

// TooDeep is the finding for a value nested deeper than ScanValue looks.
var TooDeep = Finding{Code: "DEPTH", Name: "nested too deeply to check", Why: "value nested too deeply"}

func walkValue(v reflect.Value, path []string, depth int, out *[]Located) {
	for v.IsValid() && (v.Kind() == reflect.Interface || v.Kind() == reflect.Pointer) {
		if v.IsNil() {
			return
		}
		v = v.Elem()
	}
	if !v.IsValid() {
		return
	}
	if depth > maxDepth {
		*out = append(*out, Located{Path: slices.Clone(path), Finding: TooDeep})
		return
	}
	switch v.Kind() {
	case reflect.String:
		for _, f := range Scan(v.String(), false) {
			*out = append(*out, Located{Path: slices.Clone(path), Finding: f})
		}
	case reflect.Map:
		if v.Type().Key().Kind() != reflect.String {
			return
		}
		keys := v.MapKeys()
		slices.SortFunc(keys, func(a, b reflect.Value) int { return strings.Compare(a.String(), b.String()) })
		for _, k := range keys {
			p := append(slices.Clone(path), k.String())
			for _, f := range Scan(k.String(), false) {
				*out = append(*out, Located{Path: p, InName: true, Finding: f})
			}
			walkValue(v.MapIndex(k), p, depth+1, out)
		}
	case reflect.Slice, reflect.Array:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return // bytes are not text
		}
		for i := 0; i < v.Len(); i++ {
			walkValue(v.Index(i), append(slices.Clone(path), strconv.Itoa(i)), depth+1, out)
		}
	}
}
