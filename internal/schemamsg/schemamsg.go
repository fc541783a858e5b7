// Package schemamsg words JSON Schema validation errors for whoever must fix
// the input, a person or an agent: one sentence per failing value that
// names the field as it is spelled (business_justification,
// evaluations[3].action) and says what to do, instead of the validator's
// keyword paths and internal schema URLs. It is a leaf (it imports only the
// validator), so the backend and the MCP front-end word their refusals
// alike.
package schemamsg

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// Messages returns one message per failing value of err, "field: what is
// wrong; what to do", sorted and without repeats. Fields are named from the
// validated document's root, or from under (a member path such as
// "context") when they lie below it. An error that is not a validation
// error is returned as its text.
func Messages(err error, under ...string) []string {
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return []string{err.Error()}
	}
	var out []string
	var walk func(*jsonschema.ValidationError)
	walk = func(v *jsonschema.ValidationError) {
		if len(v.Causes) == 0 {
			loc := v.InstanceLocation
			if len(loc) >= len(under) && slices.Equal(loc[:len(under)], under) {
				loc = loc[len(under):]
			}
			out = append(out, messages(loc, v.ErrorKind)...)
			return
		}
		for _, c := range v.Causes {
			walk(c)
		}
	}
	walk(ve)
	sort.Strings(out)
	return slices.Compact(out)
}

// Join puts messages in one line: each is a sentence of its own.
func Join(msgs []string) string { return strings.Join(msgs, ". ") }

// Field names a location the way it is written: members joined by dots,
// array items by index (evaluations[3].action).
func Field(loc []string) string {
	var b strings.Builder
	for _, tok := range loc {
		if _, err := strconv.Atoi(tok); err == nil && b.Len() > 0 {
			b.WriteString("[" + tok + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteString(".")
		}
		b.WriteString(tok)
	}
	return b.String()
}

// messages words one failing value.
func messages(loc []string, k jsonschema.ErrorKind) []string {
	field := Field(loc)
	if field == "" {
		field = "the input"
	}
	at := func(format string, args ...any) []string {
		return []string{field + ": " + fmt.Sprintf(format, args...)}
	}
	member := func(name, format string, args ...any) string {
		return Field(append(slices.Clone(loc), name)) + ": " + fmt.Sprintf(format, args...)
	}
	switch k := k.(type) {
	case *kind.Required:
		var out []string
		for _, m := range k.Missing {
			out = append(out, member(m, "is required; provide %s", withArticle(human(m))))
		}
		return out
	case *kind.DependentRequired:
		var out []string
		for _, m := range k.Missing {
			out = append(out, member(m, "is required when %s is given; provide %s", k.Prop, withArticle(human(m))))
		}
		return out
	case *kind.Dependency:
		var out []string
		for _, m := range k.Missing {
			out = append(out, member(m, "is required when %s is given; provide %s", k.Prop, withArticle(human(m))))
		}
		return out
	case *kind.AdditionalProperties:
		var out []string
		for _, p := range k.Properties {
			out = append(out, member(p, "is not a field here; remove it"))
		}
		return out
	case *kind.Type:
		return at("must be %s, not %s; send it as %s", typeNames(k.Want), typeName(k.Got), typeName(k.Want[0]))
	case *kind.MinLength:
		if k.Want == 1 {
			return at("must not be empty; provide %s", withArticle(leaf(loc)))
		}
		return at("must be at least %d characters; give a longer %s", k.Want, leaf(loc))
	case *kind.MaxLength:
		return at("must be at most %d characters; shorten it", k.Want)
	case *kind.Pattern:
		return at("does not have the expected form (pattern %s); correct it to match", k.Want)
	case *kind.Format:
		return at("is not a valid %s; give one in that format", k.Want)
	case *kind.Enum:
		return at("must be one of %s; use one of these", values(k.Want))
	case *kind.Const:
		return at("must be %s; send exactly that", value(k.Want))
	case *kind.Minimum:
		return at("must be at least %s; use a larger number", number(k.Want))
	case *kind.ExclusiveMinimum:
		return at("must be greater than %s; use a larger number", number(k.Want))
	case *kind.Maximum:
		return at("must be at most %s; use a smaller number", number(k.Want))
	case *kind.ExclusiveMaximum:
		return at("must be less than %s; use a smaller number", number(k.Want))
	case *kind.MultipleOf:
		return at("must be a multiple of %s; round it", number(k.Want))
	case *kind.MinItems:
		return at("must have at least %d %s; add more", k.Want, plural(k.Want, "item"))
	case *kind.MaxItems:
		return at("must have at most %d %s; remove some", k.Want, plural(k.Want, "item"))
	case *kind.AdditionalItems:
		return at("has more items than allowed; remove the last %d", k.Count)
	case *kind.UniqueItems:
		return at("items %d and %d are the same; remove one", k.Duplicates[0], k.Duplicates[1])
	case *kind.MinProperties:
		return at("must have at least %d %s; add more", k.Want, plural(k.Want, "field"))
	case *kind.MaxProperties:
		return at("must have at most %d %s; remove some", k.Want, plural(k.Want, "field"))
	case *kind.FalseSchema:
		return at("is not allowed; remove it")
	}
	// The rest (anyOf, oneOf, not, contains, ...) have no plainer words
	// than the validator's own.
	return at("%s; correct it", k.LocalizedString(printer))
}

var printer = message.NewPrinter(language.English)

// human is a field name in words: business_justification is "business
// justification".
func human(name string) string {
	return strings.NewReplacer("_", " ", "-", " ").Replace(name)
}

// leaf is the last field of loc in words, or "value".
func leaf(loc []string) string {
	if len(loc) == 0 {
		return "value"
	}
	if _, err := strconv.Atoi(loc[len(loc)-1]); err == nil {
		return "item"
	}
	return human(loc[len(loc)-1])
}

func withArticle(s string) string {
	if s != "" && strings.ContainsRune("aeioAEIO", rune(s[0])) {
		return "an " + s
	}
	return "a " + s
}

func plural(n int, s string) string {
	if n == 1 {
		return s
	}
	return s + "s"
}

func typeName(t string) string {
	switch t {
	case "string":
		return "a string"
	case "number":
		return "a number"
	case "integer":
		return "an integer"
	case "boolean":
		return "true or false"
	case "object":
		return "an object"
	case "array":
		return "a list"
	}
	return t
}

func typeNames(ts []string) string {
	names := make([]string, len(ts))
	for i, t := range ts {
		names[i] = typeName(t)
	}
	return strings.Join(names, " or ")
}

// value writes a schema's value (from enum or const) as JSON.
func value(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// values lists up to ten enum values.
func values(vs []any) string {
	parts := make([]string, 0, len(vs))
	for i, v := range vs {
		if i == 10 {
			parts = append(parts, fmt.Sprintf("and %d more", len(vs)-10))
			break
		}
		parts = append(parts, value(v))
	}
	return strings.Join(parts, ", ")
}

// number writes a schema bound as a decimal.
func number(r *big.Rat) string {
	if r.IsInt() {
		return r.Num().String()
	}
	return strings.TrimRight(strings.TrimRight(r.FloatString(6), "0"), ".")
}
