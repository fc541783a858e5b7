package webhook_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/clean"
	"github.com/omcp/arap/webhook"
)

// FuzzVerify feeds arbitrary webhook headers and bodies to the receiving
// side: nothing panics; a message verifies only if one of its signatures
// is the HMAC of exactly its id, timestamp and body under a known secret
// with a timestamp inside the tolerance; every refusal is one of the typed
// errors; and the correctly signed form of the same message always
// verifies.
func FuzzVerify(f *testing.F) {
	secret := "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	key, err := webhook.ParseSecret(secret)
	require.NoError(f, err)
	now := time.Unix(1_900_000_000, 0)
	body := `{"state":"tsk_1","task":{"id":"arq_1","status":"approved"}}`
	good := webhook.Sign(key, "msg_1", now.Unix(), []byte(body))
	for _, c := range [][4]string{
		{"msg_1", strconv.FormatInt(now.Unix(), 10), good, body},
		{"msg_1", strconv.FormatInt(now.Unix(), 10), "v1,AAAA " + good, body},
		{"msg_1", strconv.FormatInt(now.Unix()-301, 10), good, body},
		{"msg_1", "1e9", good, body}, {"", "", "", ""}, {"msg_1", "-9223372036854775808", "v1,", "{}"},
		{"msg_1", "9223372036854775807", good, body}, {"msg_\x00", strconv.FormatInt(now.Unix(), 10), "v1,\xff", body},
		{"msg_1", strconv.FormatInt(now.Unix(), 10), strings.ToUpper(good), body},
	} {
		f.Add(c[0], c[1], c[2], []byte(c[3]))
	}
	f.Fuzz(func(t *testing.T, id, ts, sigs string, body []byte) {
		v, err := webhook.NewVerifier(secret)
		require.NoError(t, err)
		v.Now = func() time.Time { return now }
		h := http.Header{}
		h.Set(webhook.HeaderID, id)
		h.Set(webhook.HeaderTimestamp, ts)
		h.Set(webhook.HeaderSignature, sigs)
		got, err := v.Verify(h, body)
		if err == nil {
			require.Equal(t, id, got)
			sec, perr := strconv.ParseInt(ts, 10, 64)
			require.NoError(t, perr)
			require.LessOrEqual(t, now.Sub(time.Unix(sec, 0)).Abs(), v.Tolerance)
			want := webhook.Sign(key, id, sec, body)
			require.Contains(t, strings.Fields(sigs), want, "verified without the right signature")
		} else {
			require.True(t, errors.Is(err, webhook.ErrMissingHeaders) || errors.Is(err, webhook.ErrTimestamp) ||
				errors.Is(err, webhook.ErrSignature), "untyped refusal: %v", err)
		}
		if id == "" {
			return
		}
		h.Set(webhook.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
		h.Set(webhook.HeaderSignature, webhook.Sign(key, id, now.Unix(), body))
		got, err = v.Verify(h, body)
		require.NoError(t, err, "a correctly signed message verifies")
		require.Equal(t, id, got)
	})
}

// FuzzParseBody: a callback body the receiver accepts names a state and a
// task id it can look up (present, short, valid UTF-8, no NUL), and reads
// the same after a round trip; anything else is ErrBody.
func FuzzParseBody(f *testing.F) {
	for _, s := range []string{`{"state":"tsk_1","task":{"id":"arq_1","status":"approved","status_endpoint":"https://x/y"}}`,
		`{"state":"tsk_\u0000","task":{"id":"arq_1"}}`, `{"state":"s","task":{"id":""}}`, `{"task":{"id":"a"}}`, `[]`, `null`,
		`{"state":"` + strings.Repeat("a", 256) + `","task":{"id":"a"}}`, "{\"state\":\"\xff\",\"task\":{\"id\":\"a\"}}", `{"state":"s","task":"x"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		b, err := webhook.ParseBody(raw)
		if err != nil {
			require.ErrorIs(t, err, webhook.ErrBody)
			return
		}
		for _, s := range []string{b.State, b.Task.ID} {
			require.NotEmpty(t, s)
			require.LessOrEqual(t, len(s), 255)
			require.NoError(t, clean.Text(s))
		}
		out, err := json.Marshal(b)
		require.NoError(t, err)
		back, err := webhook.ParseBody(out)
		require.NoError(t, err)
		require.Equal(t, b.State, back.State)
		require.Equal(t, b.Task.ID, back.Task.ID)
	})
}
