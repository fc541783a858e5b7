package webhook_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/webhook"
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
	key, err := webhook.ParseSecret(secret)
	require.NoError(t, err)
	require.Equal(t, want, webhook.Sign(key, id, ts, []byte(body)))

	raw, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	mac := hmac.New(sha256.New, raw)
	mac.Write([]byte(id + "." + strconv.FormatInt(ts, 10) + "." + body))
	require.Equal(t, "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)), webhook.Sign(key, id, ts, []byte(body)))

	other, _ := webhook.ParseSecret(webhook.NewSecret())
	h := webhook.SignatureHeader([][]byte{key, other}, id, ts, []byte(body))
	require.Equal(t, 2, len(strings.Fields(h)), "both secrets sign during a rotation")
	require.True(t, strings.HasPrefix(h, want+" v1,"))

	for _, bad := range []string{"", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_!!!", "whsec_c2hvcnQ="} {
		_, err := webhook.ParseSecret(bad)
		require.Error(t, err, bad)
	}
}

func signed(t *testing.T, secret, id string, ts time.Time, body string) *http.Request {
	t.Helper()
	key, err := webhook.ParseSecret(secret)
	require.NoError(t, err)
	r := httptest.NewRequest("POST", "/cb", strings.NewReader(body))
	r.Header.Set(webhook.HeaderID, id)
	r.Header.Set(webhook.HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	r.Header.Set(webhook.HeaderSignature, webhook.Sign(key, id, ts.Unix(), []byte(body)))
	return r
}

func TestVerifier(t *testing.T) {
	secret, rotated := webhook.NewSecret(), webhook.NewSecret()
	v, err := webhook.NewVerifier(secret, rotated)
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

	// A copy of a handled id, even freshly signed (the sender's retry after
	// it lost the answer), is answered 200 and never reaches the handler.
	before := calls
	require.Equal(t, 200, serve(signed(t, secret, "msg_1", now.Add(time.Second), `{"a":1}`)))
	require.Equal(t, before, calls, "a copy is not handled again")

	// Forged: signed with another secret, or a body changed after signing.
	require.Equal(t, 401, serve(signed(t, webhook.NewSecret(), "msg_3", now, `{"a":1}`)))
	r := signed(t, secret, "msg_4", now, `{"a":1}`)
	r.Body = http.NoBody
	require.Equal(t, 401, serve(r))
	r = signed(t, secret, "msg_4", now, `{"a":1}`)
	r.Header.Del(webhook.HeaderSignature)
	require.Equal(t, 401, serve(r))

	// Too old, or from the future, beyond the 5-minute tolerance.
	require.Equal(t, 401, serve(signed(t, secret, "msg_5", now.Add(-6*time.Minute), `{}`)))
	require.Equal(t, 401, serve(signed(t, secret, "msg_6", now.Add(6*time.Minute), `{}`)))
	require.Equal(t, 200, serve(signed(t, secret, "msg_7", now.Add(-4*time.Minute), `{}`)))

	// A delivery the handler failed is released: its retry gets through,
	// and is then remembered.
	status = http.StatusInternalServerError
	require.Equal(t, 500, serve(signed(t, secret, "msg_8", now, `{}`)))
	status = http.StatusOK
	require.Equal(t, 200, serve(signed(t, secret, "msg_8", now.Add(5*time.Second), `{}`)))
	require.Equal(t, 200, serve(signed(t, secret, "msg_8", now.Add(6*time.Second), `{}`)))
	require.Equal(t, 5, calls, "the handler sees only verified callbacks, each id handled once")

	// The memory lasts twice the tolerance; after that the id is new again
	// (a redelivery by hand), and any old copy fails the timestamp check.
	later := now.Add(10*time.Minute + time.Second)
	v.Now = func() time.Time { return later }
	require.Equal(t, 200, serve(signed(t, secret, "msg_1", later, `{"a":1}`)))

	_, err = webhook.NewVerifier()
	require.Error(t, err)
}

// TestVerifierClaimsBeforeHandling: of simultaneous copies of one signed
// delivery, exactly one reaches the handler, however long it takes; the
// others are refused at once (409) rather than handled after it.
func TestVerifierClaimsBeforeHandling(t *testing.T) {
	secret := webhook.NewSecret()
	v, err := webhook.NewVerifier(secret)
	require.NoError(t, err)
	var calls atomic.Int32
	proceed := make(chan struct{})
	srv := httptest.NewServer(v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		select {
		case <-proceed:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusNoContent)
	})))
	defer srv.Close()
	codes := sendCopies(t, srv.URL, secret, "msg_twin", 6, proceed)
	require.Equal(t, []int{204, 409, 409, 409, 409, 409}, codes)
	require.EqualValues(t, 1, calls.Load())
}

// sendCopies posts n copies of one signed delivery at once, and closes
// proceed once n-1 answers are in (the handler holds the winner until then).
// It returns the status codes, sorted.
func sendCopies(t *testing.T, url, secret, id string, n int, proceed chan struct{}) []int {
	t.Helper()
	key, err := webhook.ParseSecret(secret)
	require.NoError(t, err)
	ts := time.Now().Unix()
	body := []byte(`{"state":"s"}`)
	sig := webhook.Sign(key, id, ts, body)
	results := make(chan int, n)
	for range n {
		go func() {
			req, _ := http.NewRequest("POST", url, bytes.NewReader(body))
			req.Header.Set(webhook.HeaderID, id)
			req.Header.Set(webhook.HeaderTimestamp, strconv.FormatInt(ts, 10))
			req.Header.Set(webhook.HeaderSignature, sig)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				results <- 0
				return
			}
			resp.Body.Close()
			results <- resp.StatusCode
		}()
	}
	var codes []int
	release := sync.OnceFunc(func() { close(proceed) })
	defer release()
	timeout := time.After(30 * time.Second)
	for len(codes) < n {
		if len(codes) == n-1 {
			release()
		}
		select {
		case c := <-results:
			codes = append(codes, c)
		case <-timeout:
			t.Fatalf("only %d of %d copies answered: more than one reached the handler (%v)", len(codes), n, codes)
		}
	}
	sort.Ints(codes)
	return codes
}

// TestVerifierReleasesWhenHandlerPanics: a handler that panics has not
// handled the callback, so the sender's retry is not refused as a replay.
func TestVerifierReleasesWhenHandlerPanics(t *testing.T) {
	secret := webhook.NewSecret()
	v, err := webhook.NewVerifier(secret)
	require.NoError(t, err)
	panics := true
	h := v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if panics {
			panic("handler failed")
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	now := time.Now()
	require.Panics(t, func() { h.ServeHTTP(httptest.NewRecorder(), signed(t, secret, "msg_p", now, `{}`)) })
	panics = false
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, signed(t, secret, "msg_p", now.Add(time.Second), `{}`))
	require.Equal(t, http.StatusNoContent, rec.Code)
}

// TestAfterHandledRunsOnceAnswered: what a handler leaves for after its
// answer runs once the message is marked handled and the answer has reached
// the sender, and not at all when the handler refuses the message.
func TestAfterHandledRunsOnceAnswered(t *testing.T) {
	secret := webhook.NewSecret()
	v, err := webhook.NewVerifier(secret)
	require.NoError(t, err)
	answered := make(chan struct{})
	ran := make(chan string, 2)
	code := http.StatusNoContent
	srv := httptest.NewServer(v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(webhook.HeaderID)
		assert.True(t, webhook.AfterHandled(r.Context(), func() {
			select { // the sender has the answer before this runs
			case <-answered:
				handled, err := v.Replay.Handled(context.Background(), id)
				if err != nil || !handled {
					ran <- "not marked handled"
					return
				}
				ran <- "after the answer"
			case <-time.After(10 * time.Second):
				ran <- "before the answer"
			}
		}))
		w.WriteHeader(code)
	})))
	t.Cleanup(srv.Close)
	key, err := webhook.ParseSecret(secret)
	require.NoError(t, err)
	send := func(id string) int {
		req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(`{}`))
		ts := time.Now().Unix()
		req.Header.Set(webhook.HeaderID, id)
		req.Header.Set(webhook.HeaderTimestamp, strconv.FormatInt(ts, 10))
		req.Header.Set(webhook.HeaderSignature, webhook.Sign(key, id, ts, []byte(`{}`)))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusNoContent, send("msg_after"))
	close(answered)
	require.Equal(t, "after the answer", <-ran)

	code = http.StatusInternalServerError
	require.Equal(t, http.StatusInternalServerError, send("msg_refused"))
	srv.Close() // waits for the handler, and anything it ran after its answer
	require.Empty(t, ran, "nothing ran for a refused message")
	require.False(t, webhook.AfterHandled(context.Background(), func() {}), "outside the middleware")
}
