package authzen_test

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gowebpki/jcs"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
)

// reference is the slow path Canonical replaced: json.Marshal, then the JCS
// library's Transform.
func reference(v any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return jcs.Transform(raw)
}

// trickyStrings exercise every escaping and ordering rule of RFC 8785:
// short escapes, other control characters, characters JSON.stringify leaves
// alone but json.Marshal escapes (<, >, &, U+2028), astral characters (whose
// UTF-16 order differs from code point order against U+E000..U+FFFF), and
// invalid UTF-8.
var trickyStrings = []string{
	"", "a", "A", "ab", "b", "\"", "\\", "/", "\b\f\n\r\t", "\x00\x01\x1f\x7f",
	"<script>&amp;</script>", "\u2028\u2029", "é", "e\u0301", "€", "\ufb33",
	"\U0001f600", "\U0001d11e", "\ue000", "\uffee", "\uffff", "日本",
	"\xff", "a\xc3", "\xed\xa0\x80", "mixed \U0001f600 and \ue000 and \x01",
}

func randomString(r *rand.Rand) string {
	if r.IntN(2) == 0 {
		return trickyStrings[r.IntN(len(trickyStrings))]
	}
	var sb strings.Builder
	for n := r.IntN(6); n > 0; n-- {
		sb.WriteString(trickyStrings[r.IntN(len(trickyStrings))])
	}
	return sb.String()
}

func randomNumber(r *rand.Rand) float64 {
	switch r.IntN(6) {
	case 0:
		return math.Float64frombits(r.Uint64()) // any bit pattern; NaN and Inf are filtered below
	case 1:
		return float64(r.Int64N(1<<53)) * float64(1-2*r.IntN(2))
	case 2:
		return math.Copysign(0, -1)
	case 3:
		return []float64{1e21, 1e-7, 1e20, 1e-6, 5e-324, math.MaxFloat64, 0.1, 1.0 / 3}[r.IntN(8)]
	default:
		return r.NormFloat64() * math.Pow(10, float64(r.IntN(40)-20))
	}
}

func randomValue(r *rand.Rand, depth int) any {
	k := r.IntN(9)
	if depth > 4 {
		k = r.IntN(5)
	}
	switch k {
	case 0:
		return nil
	case 1:
		return r.IntN(2) == 0
	case 2:
		return randomString(r)
	case 3:
		f := randomNumber(r)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			f = 0
		}
		return f
	case 4:
		// Including forms strconv accepts and JSON does not.
		return json.Number([]string{"0", "-0", "1e3", "12345678901234567890", "0.000001", "1.5E-7", "+1", ".5", "1_000", "0x10"}[r.IntN(10)])
	case 5, 6:
		switch r.IntN(12) {
		case 0:
			return map[string]any(nil)
		case 1:
			return authzen.Object(nil)
		case 2:
			return []any(nil)
		case 3: // invalid UTF-8 keys that are one key after U+FFFD replacement
			return map[string]any{"a\xff\xff": 1.0, "a\xc3\xff": 2.0}
		}
		m := map[string]any{}
		for n := r.IntN(6); n > 0; n-- {
			m[randomString(r)] = randomValue(r, depth+1)
		}
		if r.IntN(2) == 0 {
			return authzen.Object(m)
		}
		return m
	case 7:
		a := make([]any, r.IntN(5))
		for i := range a {
			a[i] = randomValue(r, depth+1)
		}
		return a
	default:
		return []string{randomString(r), randomString(r)} // not a decoded shape: the fallback path
	}
}

// TestCanonicalAgreesWithTransform checks the direct encoder byte for byte
// against Marshal+Transform on random values built from the cases where the
// two could differ.
func TestCanonicalAgreesWithTransform(t *testing.T) {
	r := rand.New(rand.NewPCG(2848, 611))
	for i := range 20000 {
		v := randomValue(r, 0)
		want, wantErr := reference(v)
		got, err := authzen.Canonical(v)
		if wantErr != nil {
			require.Error(t, err, "case %d: reference failed (%v) but Canonical did not", i, wantErr)
			continue
		}
		require.NoError(t, err, "case %d", i)
		require.Equal(t, string(want), string(got), "case %d: %#v", i, v)
	}
}

// TestCanonicalRefusesWhatJSONCannotSay: NaN and infinities have no JSON
// form; both paths refuse them rather than hash something else.
func TestCanonicalRefusesWhatJSONCannotSay(t *testing.T) {
	for _, v := range []any{
		math.NaN(), math.Inf(1), math.Inf(-1),
		map[string]any{"a": []any{1.0, math.Inf(-1)}},
		json.Number("not-a-number"),
	} {
		_, err := authzen.Canonical(v)
		require.Error(t, err, "%#v", v)
		_, err = reference(v)
		require.Error(t, err, "reference on %#v", v)
	}
}

// TestCanonicalDepthIsBounded: a hostile value nested past the bound is an
// error, not a stack overflow.
func TestCanonicalDepthIsBounded(t *testing.T) {
	var v any = "x"
	for range 10050 {
		v = []any{v}
	}
	_, err := authzen.Canonical(v)
	require.ErrorContains(t, err, "nested too deeply")
}

func BenchmarkCanonical(b *testing.B) {
	var v any
	require.NoError(b, json.Unmarshal([]byte(`{"subject":{"type":"user","id":"alice@example.com","properties":{"department":"eng"}},
	"action":{"name":"tools/call"},"resource":{"type":"tool","id":"deploy","properties":{"arguments":{"env":"prod","replicas":3,"tags":["a","b"]}}},
	"context":{"time":"2026-11-30T00:00:00Z","client_id":"mcp-pep"}}`), &v))
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			if _, err := authzen.Canonical(v); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("marshal+transform", func(b *testing.B) {
		for b.Loop() {
			if _, err := reference(v); err != nil {
				b.Fatal(err)
			}
		}
	})
}
