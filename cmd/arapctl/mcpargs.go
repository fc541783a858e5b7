package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"strings"
)

// toolArguments builds a call's arguments from --args and then --arg. A
// --arg value is typed by the tool's input schema (from tools/list): a
// string property takes the text as it is, so `--arg to=991` sends "991";
// any other type takes the value as JSON (50000, true, {"a":1}). Where the
// schema does not say, the value is JSON when it parses, else text.
func (m *mcpCmd) toolArguments(ctx context.Context, tool string, flags []string, raw string) (map[string]any, error) {
	args := map[string]any{}
	if raw != "" {
		if err := json.Unmarshal([]byte(raw), &args); err != nil {
			return nil, usageError{msg: "--args must be a JSON object: " + err.Error()}
		}
	}
	kv, err := pairs(flags, "--arg")
	if err != nil {
		return nil, err
	}
	if len(kv) == 0 {
		return args, nil
	}
	props := m.properties(ctx, tool)
	for name, text := range kv {
		prop, _ := props[name].(map[string]any)
		v, err := argValue(tool, name, text, schemaTypes(prop))
		if err != nil {
			return nil, err
		}
		args[name] = v
	}
	return args, nil
}

// properties returns the properties of the tool's input schema, or nil when
// the server does not list the tool (the call then says what is wrong).
func (m *mcpCmd) properties(ctx context.Context, tool string) map[string]any {
	tools, _, err := m.client.ListTools(ctx)
	if err != nil {
		return nil
	}
	for _, t := range tools {
		if t.Name == tool {
			var schema struct {
				Properties map[string]any `json:"properties"`
			}
			_ = json.Unmarshal(t.InputSchema, &schema) // not an object: no properties
			return schema.Properties
		}
	}
	return nil
}

// schemaTypes is the set of JSON types a property schema allows; nil when
// it does not say.
func schemaTypes(prop map[string]any) map[string]bool {
	switch t := prop["type"].(type) {
	case string:
		return map[string]bool{t: true}
	case []any:
		types := map[string]bool{}
		for _, x := range t {
			if s, ok := x.(string); ok {
				types[s] = true
			}
		}
		return types
	}
	return nil
}

// argValue types one --arg value (see toolArguments).
func argValue(tool, name, text string, types map[string]bool) (any, error) {
	v, parsed := decodeJSON(text)
	if parsed && (types == nil || types[jsonType(v)] || (types["number"] && jsonType(v) == "integer")) {
		return v, nil
	}
	if types == nil || types["string"] {
		return text, nil
	}
	var want []string
	for _, t := range []string{"integer", "number", "boolean", "object", "array", "null"} {
		if types[t] {
			want = append(want, t)
		}
	}
	if len(want) == 0 {
		return nil, usageError{msg: fmt.Sprintf("--arg %s: the input schema of %s gives %s no type this client can send", name, tool, name)}
	}
	return nil, usageError{msg: fmt.Sprintf("--arg %s=%s: %s of %s takes %s; write it as JSON, such as --arg %s=%s",
		name, text, name, tool, typeNames(want), name, typeExamples[want[0]])}
}

var typeExamples = map[string]string{"integer": "3", "number": "12.5", "boolean": "true", "object": `'{"key":"value"}'`, "array": `'["a","b"]'`, "null": "null"}

func typeNames(types []string) string {
	names := map[string]string{"integer": "an integer", "number": "a number", "boolean": "true or false", "object": "a JSON object", "array": "a JSON array", "null": "null"}
	var out []string
	for _, t := range types {
		out = append(out, names[t])
	}
	return strings.Join(out, " or ")
}

// decodeJSON decodes one whole JSON value, keeping numbers exact.
func decodeJSON(text string) (any, bool) {
	if !json.Valid([]byte(text)) {
		return nil, false
	}
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	var v any
	return v, dec.Decode(&v) == nil
}

// jsonType names the JSON Schema type of a decoded value; a number without
// a fractional part is an integer.
func jsonType(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case json.Number:
		if r, ok := new(big.Rat).SetString(x.String()); ok && r.IsInt() {
			return "integer"
		}
		return "number"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	}
	return ""
}
