package callbacks_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/callbacks"
)

// The Standard Webhooks specification's example, and the same signature
// computed here by hand from its definition.
func TestSignatureMatchesStandardWebhooks(t *testing.T) {
	const (
		secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		id     = "msg_p5jXN8AQM9LWM0D4loKWxJek"
		ts     = int64(1614265330)
		body   = `{"test": 2432232314}`
		want   = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	)
	key, err := callbacks.ParseSecret(secret)
	require.NoError(t, err)
	require.Equal(t, want, callbacks.Sign(key, id, ts, []byte(body)))

	raw, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	mac := hmac.New(sha256.New, raw)
	mac.Write([]byte(id + "." + strconv.FormatInt(ts, 10) + "." + body))
	require.Equal(t, "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)), callbacks.Sign(key, id, ts, []byte(body)))

	other, _ := callbacks.ParseSecret(callbacks.NewSecret())
	h := callbacks.SignatureHeader([][]byte{key, other}, id, ts, []byte(body))
	require.Equal(t, 2, len(strings.Fields(h)), "both secrets sign during a rotation")
	require.True(t, strings.HasPrefix(h, want+" v1,"))

	for _, bad := range []string{"", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_!!!", "whsec_c2hvcnQ="} {
		_, err := callbacks.ParseSecret(bad)
		require.Error(t, err, bad)
	}
}

func signed(t *testing.T, secret, id string, ts time.Time, body string) *http.Request {
	t.Helper()
	key, err := callbacks.ParseSecret(secret)
	require.NoError(t, err)
	r := httptest.NewRequest("POST", "/cb", strings.NewReader(body))
	r.Header.Set(callbacks.HeaderID, id)
	r.Header.Set(callbacks.HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	r.Header.Set(callbacks.HeaderSignature, callbacks.Sign(key, id, ts.Unix(), []byte(body)))
	return r
}

func TestVerifier(t *testing.T) {
	secret, rotated := callbacks.NewSecret(), callbacks.NewSecret()
	v, err := callbacks.NewVerifier(secret, rotated)
	require.NoError(t, err)
	calls := 0
	status := http.StatusOK
	h := v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		w.WriteHeader(status)
	}))
	serve := func(r *http.Request) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	now := time.Now()
	require.Equal(t, 200, serve(signed(t, secret, "msg_1", now, `{"a":1}`)))
	require.Equal(t, 200, serve(signed(t, rotated, "msg_2", now, `{"a":1}`)), "either secret of a rotation verifies")

	// A replay of an accepted id is refused, even freshly signed.
	require.Equal(t, 409, serve(signed(t, secret, "msg_1", now.Add(time.Second), `{"a":1}`)))

	// Forged: signed with another secret, or a body changed after signing.
	require.Equal(t, 401, serve(signed(t, callbacks.NewSecret(), "msg_3", now, `{"a":1}`)))
	r := signed(t, secret, "msg_4", now, `{"a":1}`)
	r.Body = http.NoBody
	require.Equal(t, 401, serve(r))
	r = signed(t, secret, "msg_4", now, `{"a":1}`)
	r.Header.Del(callbacks.HeaderSignature)
	require.Equal(t, 401, serve(r))

	// Too old, or from the future, beyond the 5-minute tolerance.
	require.Equal(t, 401, serve(signed(t, secret, "msg_5", now.Add(-6*time.Minute), `{}`)))
	require.Equal(t, 401, serve(signed(t, secret, "msg_6", now.Add(6*time.Minute), `{}`)))
	require.Equal(t, 200, serve(signed(t, secret, "msg_7", now.Add(-4*time.Minute), `{}`)))

	// A delivery the handler failed is not remembered: its retry gets through.
	status = http.StatusInternalServerError
	require.Equal(t, 500, serve(signed(t, secret, "msg_8", now, `{}`)))
	status = http.StatusOK
	require.Equal(t, 200, serve(signed(t, secret, "msg_8", now.Add(5*time.Second), `{}`)))
	require.Equal(t, 5, calls, "the handler sees only verified callbacks")

	_, err = callbacks.NewVerifier()
	require.Error(t, err)
}
