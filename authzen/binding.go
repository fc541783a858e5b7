package authzen

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

// Canonical returns the RFC 8785 (JCS) serialization of v.
//
// Values shaped as encoding/json decodes them into an interface (objects,
// arrays, strings, float64, bools, null) are written directly; it is the hot
// path of every binding_hash. Anything else (json.Number, structs, typed
// slices) goes through json.Marshal and jcs.Transform, the reference the
// direct path is tested against (TestCanonicalAgreesWithTransform).
func Canonical(v any) ([]byte, error) {
	out, err := appendCanonical(make([]byte, 0, 256), v, 0)
	if err != nil {
		return nil, fmt.Errorf("canonical: %w", err)
	}
	return out, nil
}

// maxDepth bounds nesting, as encoding/json does when it decodes.
const maxDepth = 10000

func appendCanonical(b []byte, v any, depth int) ([]byte, error) {
	if depth > maxDepth {
		return nil, errors.New("nested too deeply")
	}
	switch x := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case bool:
		return strconv.AppendBool(b, x), nil
	case string:
		return appendCanonicalString(b, x), nil
	case float64:
		return appendCanonicalNumber(b, x)
	case int:
		return appendCanonicalNumber(b, float64(x))
	case int64:
		return appendCanonicalNumber(b, float64(x))
	case map[string]any:
		if x == nil {
			return append(b, "null"...), nil
		}
		return appendCanonicalObject(b, x, depth)
	case Object:
		if x == nil {
			return append(b, "null"...), nil
		}
		return appendCanonicalObject(b, x, depth)
	case []any:
		if x == nil {
			return append(b, "null"...), nil
		}
		b = append(b, '[')
		for i, e := range x {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendCanonical(b, e, depth+1); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	default: // json.Number, json.RawMessage, structs, typed slices: the library decides
		return appendReference(b, v)
	}
}

// appendReference is the library path: json.Marshal, then jcs.Transform.
func appendReference(b []byte, v any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("marshal: %w", err)
	}
	c, err := jcs.Transform(raw)
	if err != nil {
		return nil, fmt.Errorf("jcs: %w", err)
	}
	return append(b, c...), nil
}

func appendCanonicalNumber(b []byte, f float64) ([]byte, error) {
	s, err := jcs.NumberToJSON(f) // ES6 number serialization; refuses NaN and infinities
	if err != nil {
		return nil, err
	}
	return append(b, s...), nil
}

func appendCanonicalObject(b []byte, m map[string]any, depth int) ([]byte, error) {
	keys := make([]string, 0, len(m))
	ascii := true
	for k := range m {
		keys = append(keys, k)
		for i := 0; ascii && i < len(k); i++ {
			ascii = k[i] < utf8.RuneSelf
		}
	}
	if !ascii && slices.ContainsFunc(keys, func(k string) bool { return !utf8.ValidString(k) }) {
		// Never from a decoder; two such keys could become one after U+FFFD
		// replacement, which the library refuses as a duplicate.
		return appendReference(b, m)
	}
	if ascii {
		slices.Sort(keys) // bytes and UTF-16 code units order ASCII alike
	} else {
		slices.SortFunc(keys, compareUTF16)
	}
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendCanonicalString(b, k)
		b = append(b, ':')
		var err error
		if b, err = appendCanonical(b, m[k], depth+1); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

// compareUTF16 orders member names by their UTF-16 code units (RFC 8785
// section 3.2.3), which differs from code point order above U+FFFF.
func compareUTF16(a, b string) int {
	return slices.Compare(utf16.Encode([]rune(a)), utf16.Encode([]rune(b)))
}

// appendCanonicalString writes s as ES6 JSON.stringify does: only '"', '\\'
// and control characters escaped, the short forms where they exist, and
// invalid UTF-8 replaced by U+FFFD (as json.Marshal does).
func appendCanonicalString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				b = utf8.AppendRune(b, utf8.RuneError)
			} else {
				b = append(b, s[i:i+size]...)
			}
			i += size
			continue
		}
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c == '\b':
			b = append(b, '\\', 'b')
		case c == '\f':
			b = append(b, '\\', 'f')
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '\r':
			b = append(b, '\\', 'r')
		case c == '\t':
			b = append(b, '\\', 't')
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
		i++
	}
	return append(b, '"')
}

// Digest is base64url-no-pad(SHA-256(JCS(v))), the binding_hash encoding.
func Digest(v any) (string, error) {
	c, err := Canonical(v)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(c)
	return base64.RawURLEncoding.EncodeToString(sum[:]), nil
}

// BoundSubject is the subject as bound: subject.properties.act is removed
// because a PEP may move the actor to client.actor. The input is not modified.
func BoundSubject(subject Object) Object {
	props := subject.Obj("properties")
	if _, ok := props["act"]; !ok {
		return subject
	}
	out := make(Object, len(subject))
	for k, v := range subject {
		out[k] = v
	}
	p := make(map[string]any, len(props))
	for k, v := range props {
		if k != "act" {
			p[k] = v
		}
	}
	out["properties"] = p
	return out
}

// RelevantContext projects context onto the authorization-relevant members.
// A listed member that is absent stays absent; one present as null is kept.
func RelevantContext(context Object, members []string) map[string]any {
	out := make(map[string]any, len(members))
	for _, m := range members {
		if v, ok := context[m]; ok {
			out[m] = v
		}
	}
	return out
}

// BindingInput is the object a single-item binding_hash covers (ARAP
// "Binding Token Integrity"): {subject, resource, action, context}.
func BindingInput(subject, resource, action, context Object, members []string) map[string]any {
	return map[string]any{
		"subject":  BoundSubject(subject),
		"resource": resource,
		"action":   action,
		"context":  RelevantContext(context, members),
	}
}

// BindingHash computes the single-item binding_hash.
func BindingHash(subject, resource, action, context Object, members []string) (string, error) {
	return Digest(BindingInput(subject, resource, action, context, members))
}

// BulkItem is one (resource, action) pair of a bulk binding.
type BulkItem struct {
	Resource Object `json:"resource"`
	Action   Object `json:"action"`
}

// BulkBindingHash computes the bulk binding_hash; item order is bound.
func BulkBindingHash(subject Object, items []BulkItem, context Object, members []string) (string, error) {
	if items == nil {
		items = []BulkItem{}
	}
	return Digest(map[string]any{
		"subject": BoundSubject(subject),
		"items":   items,
		"context": RelevantContext(context, members),
	})
}

// Equal reports whether two JSON values are structurally equal in the ARAP
// sense: same types, numbers equal in canonical form, arrays in order, objects
// with the same member names, absent distinct from null.
func Equal(a, b any) bool {
	ca, err1 := Canonical(a)
	cb, err2 := Canonical(b)
	return err1 == nil && err2 == nil && string(ca) == string(cb)
}
