package requests

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/gowebpki/jcs"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/clean"
	"github.com/omcp/arap/internal/randid"
)

// FuzzDecodeSubmission runs submission bodies through the checks Submit
// makes before it verifies anything (text, then structure): nothing
// panics; a refusal is a typed *Error with a problem code; an accepted
// submission has what the later checks rely on, holds nothing PostgreSQL
// would refuse, and decodes the same after a round trip.
func FuzzDecodeSubmission(f *testing.F) {
	valid := `{"subject":{"type":"user","id":"alice","properties":{"act":{"sub":"agent:demo"}}},"action":{"name":"tools/call"},` +
		`"resource":{"type":"mcp_tool","id":"wire_transfer","properties":{"arguments":{"to":"acct-991","amount":50000}}},` +
		`"context":{"tenant":"acme"},"denial":{"evaluation_id":"eval_1","expires_at":"2030-01-01T00:00:00Z","binding_token":"a.b.c","template":"treasury_approval"},` +
		`"callback":{"endpoint":"https://pep.example/cb","state":"tsk_1","events":["approved"]},"client":{"id":"pep"}}`
	for _, s := range []string{valid, `{}`, `[]`, `{"subject":{},"resource":{},"action":{},"denial":{}}`, `{"items":[1]}`, `{"surprise":1}`,
		`{"denial":{"binding_token":"x","nonsense":1}}`, strings.Replace(valid, `"acme"`, `"ac\u0000me"`, 1), strings.Replace(valid, `"tsk_1"`, `7`, 1),
		strings.Replace(valid, `"2030-01-01T00:00:00Z"`, `"yesterday"`, 1), `{"subject":null,"resource":null,"action":null}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if clean.JSON(body) != nil {
			return // Submit refuses it before decoding
		}
		var doc any
		if jsonv2.Unmarshal(body, &doc) != nil {
			return // Submit refuses it as invalid JSON before decoding
		}
		sub, err := decodeSubmission(body, doc)
		if err != nil {
			var re *Error
			require.True(t, errors.As(err, &re), "refusal is typed: %v", err)
			require.Contains(t, []string{authzen.ProblemInvalidRequest, authzen.ProblemUnsupported, authzen.ProblemNotRequestable,
				authzen.ProblemInvalidDenialBinding}, re.Code)
			require.NotEmpty(t, re.Detail)
			return
		}
		require.NotNil(t, sub.Subject)
		require.NotNil(t, sub.Resource)
		require.NotNil(t, sub.Action)
		require.NotNil(t, sub.Denial)
		require.NotEmpty(t, sub.Denial.BindingToken)
		require.NotNil(t, sub.Denial.ExpiresAt)
		again, err := json.Marshal(sub)
		require.NoError(t, err)
		require.NoError(t, clean.JSON(again), "what is accepted can be stored")
		var againDoc any
		require.NoError(t, json.Unmarshal(again, &againDoc))
		back, err := decodeSubmission(again, againDoc)
		require.NoError(t, err, "%s", again)
		b2, err := json.Marshal(back)
		require.NoError(t, err)
		require.JSONEq(t, string(again), string(b2))
	})
}

// FuzzIdempotencyKey: an accepted key is at most MaxIdempotencyKeyLen
// printable ASCII characters without spaces; a refusal is typed.
func FuzzIdempotencyKey(f *testing.F) {
	for _, k := range []string{"", "k-1", `"quoted"`, `""`, `"`, "with space", "k\x00", "k\xff", strings.Repeat("a", 255), strings.Repeat("a", 256), `"` + strings.Repeat("a", 255) + `"`} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, k string) {
		got, err := parseIdempotencyKey(k)
		if err != nil {
			require.Equal(t, authzen.ProblemInvalidIdempotencyKey, ErrorCode(err))
			return
		}
		require.LessOrEqual(t, len(got), MaxIdempotencyKeyLen)
		for i := 0; i < len(got); i++ {
			require.True(t, got[i] >= 0x21 && got[i] <= 0x7e, "%q", got)
		}
	})
}

// FuzzCursor: a cursor List accepts names a well-formed request id and a
// time, and encoding what it decodes gives a cursor that decodes the same.
func FuzzCursor(f *testing.F) {
	at := time.Date(2026, 11, 30, 10, 0, 0, 123456789, time.UTC)
	enc := func(at time.Time, id string) string {
		return base64.RawURLEncoding.EncodeToString([]byte(at.UTC().Format(time.RFC3339Nano) + "|" + id))
	}
	for _, c := range []string{enc(at, randid.New(RequestIDPrefix)), enc(at, "arq_\x00"), enc(at, ""), "", "not base64!", "fA", enc(at, "a|b"),
		base64.RawURLEncoding.EncodeToString([]byte("2026-13-01T00:00:00Z|arq_AAAAAAAAAAAAAAAAAAAAAAAAAA"))} {
		f.Add(c)
	}
	f.Fuzz(func(t *testing.T, c string) {
		at, id, err := decodeCursor(c)
		if err != nil {
			return
		}
		require.True(t, randid.Valid(RequestIDPrefix, id), "%q", id)
		at2, id2, err := decodeCursor(enc(at, id))
		require.NoError(t, err)
		require.True(t, at.Equal(at2))
		require.Equal(t, id, id2)
	})
}

// FuzzBodyHashIsJCS: the idempotency hash is SHA-256 of what jcs.Transform
// writes for every body both accept, so a retry hashed before and after the
// single-decode path matches; and a body jcs.Transform refuses (duplicate
// member names, bad syntax) is refused too.
func FuzzBodyHashIsJCS(f *testing.F) {
	for _, s := range []string{`{"a":1,"b":[1e21,0.1,-0,1E-7,123456789012345678],"c":"\u00e9\ud83d\ude00\n\u001f","d":{"z":null,"é":true,"a":false}}`,
		`{"a":1,"a":2}`, `{"x":{"y":1,"y":1}}`, `[1,2`, `{"amount":50000.5,"to":"acct-1"}`, `"s"`, `{"\u0061":1,"a":2}`, `{"big":1e400}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if clean.JSON(body) != nil {
			return // Submit refuses it before hashing
		}
		got, _, err := hashBody(body)
		want, jerr := jcs.Transform(body)
		if jerr != nil {
			require.Error(t, err, "jcs refuses %q: %v", body, jerr)
			return
		}
		if err != nil {
			return // refused where jcs accepts: never a wrong hash
		}
		require.Equal(t, sha256.Sum256(want), got, "%s", body)
	})
}
