// Package clean refuses outside text that no handler should pass on:
// invalid UTF-8 and NUL everywhere, and any control character in URLs.
// PostgreSQL refuses NUL and invalid UTF-8 in text and jsonb, so such a
// value reaching SQL would fail there as an internal error; refused at the
// door it is the caller's mistake, said plainly. Every HTTP surface (the
// backend and the MCP front-end) checks Path and Query in front of its
// routes; JSON bodies and free text are checked where they are decoded.
package clean

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Path returns why the (decoded) URL path p is refused, or nil. Nothing can
// live at such a path, so callers answer 404.
func Path(p string) error {
	if err := urlText(p); err != nil {
		return fmt.Errorf("the URL path %w", err)
	}
	return nil
}

// Query returns why the raw query string q is refused, or nil (callers
// answer 400).
func Query(q string) error {
	values, err := url.ParseQuery(q)
	if err != nil {
		return errors.New("the query string is malformed (a bad %-escape or a ';')")
	}
	for k, vs := range values {
		if err := urlText(k); err != nil {
			return fmt.Errorf("a query parameter name %w", err)
		}
		for _, v := range vs {
			if err := urlText(v); err != nil {
				return fmt.Errorf("the query parameter %q %w", k, err)
			}
		}
	}
	return nil
}

func urlText(s string) error {
	if !utf8.ValidString(s) {
		return errors.New("is not valid UTF-8")
	}
	if strings.ContainsFunc(s, unicode.IsControl) {
		return errors.New("holds a control character (such as NUL)")
	}
	return nil
}

// ErrNUL and ErrUTF8 are Text's and JSON's refusals.
var (
	ErrNUL  = errors.New("text may not contain NUL characters")
	ErrUTF8 = errors.New("text must be valid UTF-8")
)

// Text returns why free text (a reason, a comment) is refused, or nil.
// Line breaks and tabs are text; NUL and invalid UTF-8 are not.
func Text(s string) error {
	if !utf8.ValidString(s) {
		return ErrUTF8
	}
	if strings.IndexByte(s, 0) >= 0 {
		return ErrNUL
	}
	return nil
}

// JSON returns why a JSON document is refused, or nil: invalid UTF-8
// anywhere in it, or a NUL in any member name or string (an escaped
// "\u0000"; a raw NUL is not JSON at all). A body that is not JSON is left
// to the decoder to report.
func JSON(body []byte) error {
	if !utf8.Valid(body) {
		return ErrUTF8
	}
	if !bytes.Contains(body, []byte(`u0000`)) {
		return nil // the only way to write a NUL in JSON is \u0000
	}
	d := json.NewDecoder(bytes.NewReader(body))
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return nil // not JSON: the decoder that follows says so
		}
		if s, ok := tok.(string); ok && strings.IndexByte(s, 0) >= 0 {
			return ErrNUL
		}
	}
}
