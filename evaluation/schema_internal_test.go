package evaluation

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
)

// bySchema is ValidateRequest's schema check by the validator alone.
func bySchema(req authzen.EvaluationRequest) []string {
	inst := map[string]any{}
	for k, v := range map[string]authzen.Object{"subject": req.Subject, "resource": req.Resource, "action": req.Action, "context": req.Context} {
		if v != nil {
			inst[k] = map[string]any(v)
		}
	}
	return Violations(requestSchema.Validate(inst))
}

// TestFitsRequestSchemaAgrees holds fitsRequestSchema, which spares the
// validator, to the schema's answer: for every body here, decoded as the
// PDP's handler decodes it, it fits exactly when the validator finds
// nothing. It fails if the shortcut passes a body the schema refuses (a
// member missing, a string that is not one, properties that are not an
// object) or refuses one the schema passes.
func TestFitsRequestSchemaAgrees(t *testing.T) {
	for _, body := range schemaBodies {
		var req authzen.EvaluationRequest
		if json.Unmarshal([]byte(body), &req) != nil {
			continue
		}
		v := bySchema(req)
		require.Equal(t, len(v) == 0, fitsRequestSchema(req), "%s: %v", body, v)
	}
	// Values no decoder makes, as a batch's merged defaults or a search's
	// probe may hold them: the shortcut never passes what the schema would
	// not.
	for _, req := range []authzen.EvaluationRequest{
		{Subject: authzen.Object{"type": "user", "id": "a", "properties": authzen.Object{}}, Resource: authzen.Object{"type": "t", "id": "i"}, Action: authzen.Object{"name": "r"}},
		{Subject: authzen.Object{"type": "user", "id": "a"}, Resource: authzen.Object{"type": "t", "id": "i", "properties": map[string]any{"n": 1}}, Action: authzen.Object{"name": "r"}},
		{Subject: authzen.Object{"type": "user", "id": "a"}, Resource: authzen.Object{"type": "t", "id": "i"}, Action: authzen.Object{"name": "r"}, Context: authzen.Object{}},
		{Subject: authzen.Object{"type": "user", "id": "a"}, Resource: authzen.Object{"type": "t", "id": "i"}, Action: authzen.Object{"name": 1}},
	} {
		if fitsRequestSchema(req) {
			require.Empty(t, bySchema(req), "%v", req)
		}
	}
}

// FuzzFitsRequestSchema is TestFitsRequestSchemaAgrees over any body.
func FuzzFitsRequestSchema(f *testing.F) {
	for _, body := range schemaBodies {
		f.Add([]byte(body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req authzen.EvaluationRequest
		if json.Unmarshal(body, &req) != nil {
			return
		}
		v := bySchema(req)
		if fitsRequestSchema(req) != (len(v) == 0) {
			t.Fatalf("%s: fits %v, schema %v", body, fitsRequestSchema(req), v)
		}
	})
}

var schemaBodies = func() []string {
	valid := map[string]string{
		"subject":  `{"type":"user","id":"alice","properties":{"act":{"sub":"agent:demo"}}}`,
		"resource": `{"type":"mcp_tool","id":"wire_transfer","properties":{"arguments":{"to":"acct-991","amount":50000}}}`,
		"action":   `{"name":"tools/call","properties":{"method":"GET"}}`,
		"context":  `{"time":"2026-01-01T00:00:00Z"}`,
	}
	// Each member in turn replaced by something else, the others valid.
	others := []string{`null`, `{}`, `[]`, `"x"`, `1`, `true`,
		`{"type":"user"}`, `{"id":"a"}`, `{"type":"user","id":1}`, `{"type":null,"id":"a"}`, `{"type":"u","id":"a","properties":null}`,
		`{"type":"u","id":"a","properties":[]}`, `{"type":"u","id":"a","properties":"p"}`, `{"type":"u","id":"a","properties":{}}`,
		`{"type":"","id":""}`, `{"type":"u","id":"a","extra":[1,2]}`, `{"name":"r"}`, `{"name":1}`, `{"name":"r","properties":5}`,
		`{"name":"r","properties":{}}`, `{"name":null}`, `{"type":"u","id":"a","name":"r"}`}
	out := []string{`{}`, `[]`, `null`, `{"subject":null,"resource":null,"action":null}`}
	build := func(m map[string]string) string {
		b := "{"
		for _, k := range []string{"subject", "resource", "action", "context"} {
			if v, ok := m[k]; ok {
				if len(b) > 1 {
					b += ","
				}
				b += `"` + k + `":` + v
			}
		}
		return b + "}"
	}
	out = append(out, build(valid))
	for _, k := range []string{"subject", "resource", "action", "context"} {
		m := map[string]string{}
		for kk, v := range valid {
			if kk != k {
				m[kk] = v
			}
		}
		out = append(out, build(m)) // k missing
		for _, o := range others {
			m[k] = o
			out = append(out, build(m))
		}
	}
	return out
}()
