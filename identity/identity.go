// Package identity says whether an identifier is canonical and whether two
// identifiers name the same party.
//
// Separation of duties compares who a request is for or through (subject,
// actor chain) with who decides it. Compared as strings, "bob" has many
// spellings that are not "bob": " bob", "b\u200bob", "ｂｏｂ", "BOB",
// "user:bob". So identifiers entering the system must be canonical (NFKC-stable,
// no surrounding whitespace, no control or invisible characters; Check), and
// comparisons go through Is, which also folds whatever canonical spellings
// remain: case where the id space is case-insensitive, and type prefixes.
//
// A leaf: it imports only the standard library, x/text and internal/visible,
// so the MCP front-end may use it too.
package identity

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/cases"
	"golang.org/x/text/unicode/norm"
	"golang.org/x/text/unicode/runenames"

	"github.com/omcp/arap/internal/visible"
)

// MaxLen bounds an identifier, in bytes.
const MaxLen = 1024

// Check returns nil when id is canonical, and otherwise an error that says
// what is wrong with it (for a 400 answer: the caller must send the
// canonical form, it is never silently rewritten).
func Check(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("is empty")
	case len(id) > MaxLen:
		return fmt.Errorf("is longer than %d bytes", MaxLen)
	case !utf8.ValidString(id):
		return fmt.Errorf("is not valid UTF-8")
	}
	first, _ := utf8.DecodeRuneInString(id)
	last, _ := utf8.DecodeLastRuneInString(id)
	if unicode.IsSpace(first) || unicode.IsSpace(last) {
		return fmt.Errorf("has whitespace at its start or end")
	}
	for _, r := range id {
		if why, hidden := visible.Hidden(r); hidden && why != visible.SpaceLike {
			return fmt.Errorf("contains %s (%s)", label(r), why)
		}
	}
	if !norm.NFKC.IsNormalString(id) {
		for _, r := range id {
			if !norm.NFKC.IsNormalString(string(r)) {
				return fmt.Errorf("is not in Unicode NFKC form (%s); send %q", label(r), norm.NFKC.String(id))
			}
		}
		return fmt.Errorf("is not in Unicode NFKC form; send %q", norm.NFKC.String(id))
	}
	return nil
}

func label(r rune) string { return fmt.Sprintf("U+%04X %s", r, runenames.Name(r)) }

// ID is a known identity of a party: a name in a case-insensitive id space,
// or an opaque id compared exactly.
type ID struct {
	value string
	exact bool
}

// Name is an identity in a case-insensitive id space: directory user names,
// e-mail addresses, API client names and ids.
func Name(s string) ID { return ID{value: s} }

// Opaque is an identity compared exactly, case included (an OpenID Connect
// sub, a base64 subject).
func Opaque(s string) ID { return ID{value: s, exact: true} }

// String is the identity as given.
func (id ID) String() string { return id.value }

// Is reports whether claimed, an identifier from a request, names this
// identity: equal after NFKC, without whitespace and invisible characters,
// case-folded for a Name, and with or without a type prefix on either side
// ("user:bob" is bob; "client:dev-itsm" is the client dev-itsm).
func (id ID) Is(claimed string) bool {
	for _, a := range forms(id.value) {
		for _, b := range forms(claimed) {
			if id.key(a) != "" && id.key(a) == id.key(b) {
				return true
			}
		}
	}
	return false
}

// forms are s and, while it is typed ("type:value"), its value: "agent:
// user:bob" is also "user:bob" and "bob". Reading more into an id than it
// says can only make more people ineligible, never fewer.
func forms(s string) []string {
	out := []string{s}
	for range 4 {
		t, v, ok := strings.Cut(s, ":")
		if !ok || !isType(t) || v == "" {
			break
		}
		s = v
		out = append(out, s)
	}
	return out
}

// isType: a type prefix is a word, as in user:, agent:, client:, mailto:.
func isType(t string) bool {
	if t == "" || len(t) > 32 {
		return false
	}
	for i, r := range t {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && (r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.')) {
			return false
		}
	}
	return true
}

var fold = cases.Fold()

// key is what Is compares: NFKC with whitespace and invisible characters
// removed, and case-folded (then NFKC again, as NFKC_Casefold does) unless
// the identity is opaque.
func (id ID) key(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsSpace(r) {
			return -1
		}
		if _, hidden := visible.Hidden(r); hidden {
			return -1
		}
		return r
	}, norm.NFKC.String(strings.ToValidUTF8(s, "\uFFFD")))
	if !id.exact {
		s = norm.NFKC.String(fold.String(s))
	}
	return s
}

// Any reports whether claimed names any of ids.
func Any(ids []ID, claimed string) bool {
	for _, id := range ids {
		if id.Is(claimed) {
			return true
		}
	}
	return false
}
