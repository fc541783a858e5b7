package schemamsg_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/schemamsg"
)

const schema = `{
  "type": "object",
  "required": ["context"],
  "properties": {
    "context": {
      "type": "object",
      "required": ["business_justification"],
      "additionalProperties": false,
      "properties": {
        "business_justification": {"type": "string", "minLength": 20, "maxLength": 30},
        "ticket": {"type": "string", "minLength": 1, "pattern": "^CHG[0-9]+$"},
        "email": {"type": "string", "format": "email"},
        "priority": {"enum": ["low", "high"]},
        "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000.5},
        "count": {"type": "integer", "minimum": 1, "multipleOf": 2},
        "tags": {"type": "array", "minItems": 1, "maxItems": 2, "uniqueItems": true, "items": {"type": "string"}},
        "mode": {"const": "strict"}
      }
    }
  }
}`

func validate(t *testing.T, instance string) error {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	require.NoError(t, err)
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	require.NoError(t, c.AddResource("urn:test", doc))
	s, err := c.Compile("urn:test")
	require.NoError(t, err)
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(instance))
	require.NoError(t, err)
	return s.Validate(v)
}

// TestMessages: each failing value gets one sentence naming the field as it
// is spelled and saying what to do; nothing of the validator's own wording
// (keyword names, schema URLs, JSON pointers) shows.
func TestMessages(t *testing.T) {
	for _, tc := range []struct {
		instance string
		under    []string
		want     []string
	}{
		{`{"context": {"business_justification": "short"}}`, []string{"context"},
			[]string{"business_justification: must be at least 20 characters; give a longer business justification"}},
		{`{"context": {"business_justification": "short"}}`, nil,
			[]string{"context.business_justification: must be at least 20 characters; give a longer business justification"}},
		{`{"context": {}}`, []string{"context"},
			[]string{"business_justification: is required; provide a business justification"}},
		{`{}`, []string{"context"}, []string{"context: is required; provide a context"}},
		{`{"context": "x"}`, nil, []string{"context: must be an object, not a string; send it as an object"}},
		{`[]`, nil, []string{"the input: must be an object, not a list; send it as an object"}},
		{`{"context": {"business_justification": 5}}`, []string{"context"},
			[]string{"business_justification: must be a string, not a number; send it as a string"}},
		{`{"context": {"business_justification": "a justification that is far too long"}}`, []string{"context"},
			[]string{"business_justification: must be at most 30 characters; shorten it"}},
		{`{"context": {"business_justification": "a long enough justification", "ticket": "", "email": "nope", "priority": "urgent", "amount": 0, "count": 3, "tags": ["a", "a", "b"], "mode": "lax", "extra": 1}}`, []string{"context"},
			[]string{
				"amount: must be greater than 0; use a larger number",
				"count: must be a multiple of 2; round it",
				`email: is not a valid email; give one in that format`,
				"extra: is not a field here; remove it",
				`mode: must be "strict"; send exactly that`,
				`priority: must be one of "low", "high"; use one of these`,
				"tags: items 0 and 1 are the same; remove one",
				"tags: must have at most 2 items; remove some",
				"ticket: does not have the expected form (pattern ^CHG[0-9]+$); correct it to match",
				"ticket: must not be empty; provide a ticket",
			}},
		{`{"context": {"business_justification": "a long enough justification", "amount": 2000, "count": 0, "tags": [], "email": "a@example.com"}}`, []string{"context"},
			[]string{
				"amount: must be at most 1000.5; use a smaller number",
				"count: must be at least 1; use a larger number",
				"tags: must have at least 1 item; add more",
			}},
		{`{"context": {"business_justification": "a long enough justification", "tags": ["a", 7]}}`, []string{"context"},
			[]string{"tags[1]: must be a string, not a number; send it as a string"}},
	} {
		got := schemamsg.Messages(validate(t, tc.instance), tc.under...)
		require.Equal(t, tc.want, got, tc.instance)
		for _, m := range got {
			for _, raw := range []string{"urn:", "jsonschema", "/context", "minLength", "got ", "want "} {
				require.NotContains(t, m, raw)
			}
		}
	}
	require.Nil(t, schemamsg.Messages(nil))
	require.Equal(t, []string{"boom"}, schemamsg.Messages(errors.New("boom")))
}

func TestField(t *testing.T) {
	require.Equal(t, "evaluations[3].action.name", schemamsg.Field([]string{"evaluations", "3", "action", "name"}))
	require.Equal(t, "business_justification", schemamsg.Field([]string{"business_justification"}))
	require.Equal(t, "", schemamsg.Field(nil))
}
