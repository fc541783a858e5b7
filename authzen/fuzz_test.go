package authzen_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
)

// FuzzCanonical feeds arbitrary JSON documents, decoded as a handler
// decodes them, to Canonical (the binding_hash input): it agrees byte for
// byte with json.Marshal + jcs.Transform, and its output is a fixed point
// (canonicalising the canonical form changes nothing).
func FuzzCanonical(f *testing.F) {
	for _, s := range []string{`{}`, `null`, `[1,"a",true,null]`, `{"b":1,"a":{"d":[],"c":{}}}`, `{"\u20ac":1,"\ud83d\ude00":2,"\ue000":3}`,
		`1e21`, `-0`, `0.1`, `5e-324`, `1.7976931348623157e308`, `"\u2028<&>"`, `{"a\u0000":"\u001f"}`, `[[[[[[[[[[]]]]]]]]]]`,
		`{"amount":50000,"to":"acct-991"}`, `"\ud800"`, `{"a":1,"a":2}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		var v any
		if json.Unmarshal(doc, &v) != nil {
			return
		}
		got, err := authzen.Canonical(v)
		want, wantErr := reference(v)
		if wantErr != nil {
			require.Error(t, err, "reference refused %q (%v), Canonical did not", doc, wantErr)
			return
		}
		require.NoError(t, err, "%q", doc)
		require.Equal(t, string(want), string(got), "%q", doc)
		var back any
		require.NoError(t, json.Unmarshal(got, &back), "canonical output is JSON")
		again, err := authzen.Canonical(back)
		require.NoError(t, err)
		require.Equal(t, string(got), string(again), "canonical form is a fixed point")
	})
}

// FuzzAccessRequest reads context.access_request from decisions as the PEP
// receives them from the PDP: no input panics, and a hint that is accepted
// has an expiry and survives a round trip unchanged.
func FuzzAccessRequest(f *testing.F) {
	hint, _ := json.Marshal(authzen.Decision{Decision: false, Context: map[string]any{
		"access_request": authzen.AccessRequestHint{ExpiresAt: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC), BindingToken: "a.b.c", Template: "wire"},
		"reason":         "needs approval",
	}})
	for _, s := range []string{string(hint), `{"decision":true,"context":{"access_request":{}}}`, `{"decision":false,"context":{"access_request":"x"}}`,
		`{"decision":false,"context":{"access_request":{"expires_at":"2030-01-01T00:00:00Z","template":7}}}`,
		`{"decision":false,"context":{"access_request":{"expires_at":"0001-01-01T00:00:00Z"}}}`, `{"decision":false}`, `{"context":null}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		var d authzen.Decision
		if json.Unmarshal(doc, &d) != nil {
			return
		}
		h, ok := d.AccessRequest()
		if !ok {
			require.Nil(t, h)
			return
		}
		require.False(t, d.Decision, "only a denial carries a hint")
		require.False(t, h.ExpiresAt.IsZero())
		b, err := json.Marshal(h)
		require.NoError(t, err)
		var back authzen.AccessRequestHint
		require.NoError(t, json.Unmarshal(b, &back))
		b2, err := json.Marshal(back)
		require.NoError(t, err)
		require.JSONEq(t, string(b), string(b2))
	})
}
