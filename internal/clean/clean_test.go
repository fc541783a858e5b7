package clean_test

import (
	"encoding/json"
	"errors"
	"net/url"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/clean"
)

func TestPathAndText(t *testing.T) {
	for _, p := range []string{"/", "/access/v1/requests/arq_ABC", "/ui/requests/é"} {
		require.NoError(t, clean.Path(p))
	}
	for _, p := range []string{"/\x00", "/a\xff", "/\x7f", "/\u0085", "/a\nb"} {
		require.Error(t, clean.Path(p), "%q", p)
	}
	require.NoError(t, clean.Text("line\nbreak\tand é"))
	require.ErrorIs(t, clean.Text("a\x00"), clean.ErrNUL)
	require.ErrorIs(t, clean.Text("a\xc0\xaf"), clean.ErrUTF8)
}

// urlTextOK is the oracle for URL text: valid UTF-8 without any control
// character.
func urlTextOK(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsFunc(s, unicode.IsControl)
}

// FuzzQuery: Query admits exactly the query strings that parse and whose
// names and values are all clean text.
func FuzzQuery(f *testing.F) {
	for _, q := range []string{"", "status=pending&limit=10", "rule=%00", "rule=%ff", "a=%zz", "a=1;b=2", "%00=1", "next=%2Fui%2F", "x=%C0%AF", "x=%e2%82%ac", "x=%C2%85", "a&b&&c="} {
		f.Add(q)
	}
	f.Fuzz(func(t *testing.T, q string) {
		err := clean.Query(q)
		values, perr := url.ParseQuery(q)
		if perr != nil {
			require.Error(t, err)
			return
		}
		ok := true
		for k, vs := range values {
			ok = ok && urlTextOK(k)
			for _, v := range vs {
				ok = ok && urlTextOK(v)
			}
		}
		require.Equal(t, ok, err == nil, "Query(%q): %v", q, err)
	})
}

// hasNUL walks a decoded JSON value for a NUL in any name or string.
func hasNUL(v any) bool {
	switch x := v.(type) {
	case string:
		return strings.IndexByte(x, 0) >= 0
	case []any:
		for _, e := range x {
			if hasNUL(e) {
				return true
			}
		}
	case map[string]any:
		for k, e := range x {
			if strings.IndexByte(k, 0) >= 0 || hasNUL(e) {
				return true
			}
		}
	}
	return false
}

// FuzzJSON: a body JSON admits is valid UTF-8, and, when it is JSON, holds
// no NUL in any name or string; a JSON body with one is refused with
// ErrNUL. (A body that is not JSON is left to the decoder.)
func FuzzJSON(f *testing.F) {
	for _, b := range []string{`{}`, `{"a":"b"}`, `{"a":"\u0000"}`, `{"\u0000":1}`, `["x","y\u0000z"]`, `"\\u0000"`, `{"a":"\\\u0000"}`,
		"{\"a\":\"\xff\"}", `{"a":"\ud800"}`, `{"a":[1,2,{"b":"\u0000"}]}`, `{"a":`, `nul`, `"u0000"`, `{"x":"C:\\u0000"}`} {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		err := clean.JSON(body)
		if !utf8.Valid(body) {
			require.ErrorIs(t, err, clean.ErrUTF8)
			return
		}
		var v any
		if json.Unmarshal(body, &v) != nil {
			require.True(t, err == nil || errors.Is(err, clean.ErrNUL))
			return
		}
		if hasNUL(v) {
			require.ErrorIs(t, err, clean.ErrNUL, "%q", body)
		} else {
			require.NoError(t, err, "%q", body)
		}
	})
}
