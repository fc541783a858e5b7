package tasks

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Custom headers from tool parameters (2026-07-28 streamable HTTP, SEP-2243):
// a tool's inputSchema may mark parameters with x-mcp-header, and a client
// on HTTP mirrors their values into Mcp-Param-{name} headers, so that
// intermediaries can route on them without reading the body. A tool whose
// annotations break the rules is excluded from the client's tool list and
// never called.

// ErrInvalidTool is the refusal of a tool whose definition the client
// rejected (an invalid x-mcp-header annotation).
var ErrInvalidTool = errors.New("invalid tool definition")

// maxSafeInteger is the largest integer JavaScript represents exactly; an
// x-mcp-header integer must stay within ±(2^53-1).
const maxSafeInteger = 1<<53 - 1

// paramHeader is one mirrored parameter: where its value is in the
// arguments (a chain of properties keys) and the header's name portion.
type paramHeader struct {
	path []string
	name string
}

// toolHeaders reads a tool's x-mcp-header annotations, or says why the
// definition is invalid.
func toolHeaders(schema json.RawMessage) ([]paramHeader, error) {
	if len(schema) == 0 {
		return nil, nil
	}
	var root any
	if err := json.Unmarshal(schema, &root); err != nil {
		return nil, fmt.Errorf("inputSchema is not JSON: %w", err)
	}
	var out []paramHeader
	seen := map[string]string{} // lower-cased name -> property path
	var walk func(node any, path []string, reachable bool) error
	walk = func(node any, path []string, reachable bool) error {
		switch n := node.(type) {
		case []any:
			for _, v := range n {
				if err := walk(v, nil, false); err != nil {
					return err
				}
			}
		case map[string]any:
			for key, v := range n {
				switch key {
				case HeaderAnnotation:
					if !reachable || len(path) == 0 {
						return errors.New("x-mcp-header outside a property reachable from the schema root through properties alone")
					}
					h, err := checkAnnotation(v, n, path)
					if err != nil {
						return err
					}
					at := strings.Join(path, ".")
					if other, dup := seen[strings.ToLower(h.name)]; dup {
						return fmt.Errorf("x-mcp-header %q of %s repeats that of %s (names are case-insensitive)", h.name, at, other)
					}
					seen[strings.ToLower(h.name)] = at
					out = append(out, h)
				case "properties":
					props, _ := v.(map[string]any)
					for name, sub := range props {
						if err := walk(sub, append(append([]string(nil), path...), name), reachable); err != nil {
							return err
						}
					}
				case "enum", "const", "default", "examples":
					// instance data, not schemas
				default:
					if err := walk(v, nil, false); err != nil {
						return err
					}
				}
			}
		}
		return nil
	}
	if err := walk(root, nil, true); err != nil {
		return nil, err
	}
	return out, nil
}

// checkAnnotation validates one x-mcp-header value and its property's type.
func checkAnnotation(v any, prop map[string]any, path []string) (paramHeader, error) {
	at := strings.Join(path, ".")
	name, ok := v.(string)
	switch {
	case !ok:
		return paramHeader{}, fmt.Errorf("x-mcp-header of %s is not a string", at)
	case name == "":
		return paramHeader{}, fmt.Errorf("x-mcp-header of %s is empty", at)
	}
	for i := 0; i < len(name); i++ {
		if !isTChar(name[i]) {
			return paramHeader{}, fmt.Errorf("x-mcp-header %q of %s is not an HTTP field-name token (byte %d)", name, at, i)
		}
	}
	switch t, _ := prop["type"].(string); t {
	case "string", "integer", "boolean":
	default:
		return paramHeader{}, fmt.Errorf("x-mcp-header %q is on %s of type %v; only string, integer and boolean parameters may be mirrored", name, at, prop["type"])
	}
	return paramHeader{path: path, name: name}, nil
}

// isTChar reports whether b is an RFC 9110 tchar.
func isTChar(b byte) bool {
	switch {
	case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0
}

// paramHeaderValues returns the Mcp-Param headers of a call: the value at
// each annotated path, converted and encoded; absent or null values are
// omitted.
func paramHeaderValues(hs []paramHeader, args map[string]any) (map[string]string, error) {
	out := map[string]string{}
	for _, h := range hs {
		var v any = args
		for _, k := range h.path {
			m, ok := v.(map[string]any)
			if !ok {
				v = nil
				break
			}
			v = m[k]
		}
		if v == nil {
			continue
		}
		s, err := headerText(v)
		if err != nil {
			return nil, fmt.Errorf("argument %s (header %s%s): %w", strings.Join(h.path, "."), HeaderParamPrefix, h.name, err)
		}
		out[HeaderParamPrefix+h.name] = EncodeHeaderValue(s)
	}
	return out, nil
}

// headerText converts a primitive argument to its header text: strings
// as-is, integers in decimal, booleans as true or false.
func headerText(v any) (string, error) {
	var f float64
	switch x := v.(type) {
	case string:
		return x, nil
	case bool:
		return strconv.FormatBool(x), nil
	case json.Number:
		if i, err := x.Int64(); err == nil {
			if i > maxSafeInteger || i < -maxSafeInteger {
				return "", fmt.Errorf("%d is outside the safe integer range", i)
			}
			return strconv.FormatInt(i, 10), nil
		}
		var err error
		if f, err = x.Float64(); err != nil {
			return "", err
		}
	case float64:
		f = x
	case int:
		f = float64(x)
	case int64:
		f = float64(x)
	default:
		return "", fmt.Errorf("a %T cannot be mirrored into a header", v)
	}
	if f != math.Trunc(f) || math.Abs(f) > maxSafeInteger {
		return "", fmt.Errorf("%v is not an integer within the safe range", f)
	}
	return strconv.FormatInt(int64(f), 10), nil
}

const (
	sentinelPrefix = "=?base64?"
	sentinelSuffix = "?="
)

// EncodeHeaderValue returns s as an Mcp-Name or Mcp-Param value: as-is when
// it is plain visible ASCII (spaces inside allowed), else, and whenever it
// looks like the sentinel itself, as =?base64?{standard Base64 of UTF-8}?=.
func EncodeHeaderValue(s string) string {
	plain := s == strings.Trim(s, " \t") &&
		!(strings.HasPrefix(s, sentinelPrefix) && strings.HasSuffix(s, sentinelSuffix))
	for i := 0; plain && i < len(s); i++ {
		plain = s[i] >= 0x20 && s[i] <= 0x7e
	}
	if plain {
		return s
	}
	return sentinelPrefix + base64.StdEncoding.EncodeToString([]byte(s)) + sentinelSuffix
}
