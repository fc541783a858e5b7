package arap

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/clean"
)

// FuzzDecodeBodies decodes the decision API's and ARAP's small bodies
// (decision, cancellation, revocation) as the handlers do: nothing panics,
// a refusal says what is wrong, and what is accepted holds no text
// PostgreSQL would refuse and re-encodes to the same document.
func FuzzDecodeBodies(f *testing.F) {
	for _, s := range []string{`{"decision":"approve","reason":"CHG0042 approved","approved_until":"2030-01-01T00:00:00Z"}`,
		`{"decision":"deny"}`, `{"decision":7}`, `{"reason":"a\u0000b"}`, `{"reason":"user_abandoned","comment":"no longer needed"}`,
		`{"approved_until":"tomorrow"}`, `null`, `[]`, `{`, "{\"reason\":\"\xff\"}", `{"reason":"\ud800"}`, `{"comment":"C:\\u0000"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, v := range []any{&DecisionBody{}, &cancelBody{}, &RevokeBody{}} {
			if err := decodeJSON(body, v); err != nil {
				require.NotEmpty(t, err.Error())
				continue
			}
			out, err := json.Marshal(v)
			require.NoError(t, err)
			require.NoError(t, clean.JSON(out), "accepted %q", body)
			back := newLike(v)
			require.NoError(t, decodeJSON(out, back))
			again, err := json.Marshal(back)
			require.NoError(t, err)
			require.JSONEq(t, string(out), string(again))
		}
	})
}

func newLike(v any) any {
	switch v.(type) {
	case *DecisionBody:
		return &DecisionBody{}
	case *cancelBody:
		return &cancelBody{}
	default:
		return &RevokeBody{}
	}
}
