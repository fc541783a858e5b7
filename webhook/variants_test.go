package webhook_test

import (
	"bufio"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/webhook"
)

// rawPost sends one HTTP/1.1 request to srv written byte for byte (header
// lines in the given order, repeated and spaced as given, which net/http's
// client would normalise) and returns the status.
func rawPost(t *testing.T, srv *httptest.Server, headers []string, body string) int {
	t.Helper()
	host := strings.TrimPrefix(srv.URL, "http://")
	conn, err := net.Dial("tcp", host)
	require.NoError(t, err)
	defer conn.Close()
	msg := "POST /cb HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n" + strings.Join(headers, "\r\n") +
		"\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	_, err = conn.Write([]byte(msg))
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	return resp.StatusCode
}

// TestVariantIsAReplay: once a callback is handled, no byte-level variant
// of it is handled again: its timestamp written with a sign, leading zeros
// or spaces; its signatures padded, reordered or joined by a signature
// that matches nothing; its headers in another order or case; the id or
// signature header repeated. Each variant is first shown to verify and be
// handled on a receiver of its own, so what refuses it is the replay
// memory, which keys on the webhook-id the signature covers, not on how
// the headers spell the message.
func TestVariantIsAReplay(t *testing.T) {
	secret, rotated := webhook.NewSecret(), webhook.NewSecret()
	keys := make([][]byte, 2)
	for i, s := range []string{secret, rotated} {
		k, err := webhook.ParseSecret(s)
		require.NoError(t, err)
		keys[i] = k
	}
	const id, body = "msg_variant", `{"state":"s","task":{"id":"t1"}}`
	now := time.Now().Unix()
	ts := strconv.FormatInt(now, 10)
	sig1, sig2 := webhook.Sign(keys[0], id, now, []byte(body)), webhook.Sign(keys[1], id, now, []byte(body))
	bogus := webhook.Sign(keys[0], "msg_other", now, []byte(body))

	receiver := func() (*httptest.Server, *atomic.Int32) {
		v, err := webhook.NewVerifier(secret, rotated)
		require.NoError(t, err)
		var calls atomic.Int32
		srv := httptest.NewServer(v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			calls.Add(1)
			w.WriteHeader(http.StatusNoContent)
		})))
		t.Cleanup(srv.Close)
		return srv, &calls
	}
	ct := "Content-Type: application/json"
	original := []string{ct, "webhook-id: " + id, "webhook-timestamp: " + ts, "webhook-signature: " + sig1 + " " + sig2}
	variants := map[string][]string{
		"the same bytes":       original,
		"timestamp with +":     {ct, "webhook-id: " + id, "webhook-timestamp: +" + ts, "webhook-signature: " + sig1},
		"timestamp with zeros": {ct, "webhook-id: " + id, "webhook-timestamp: 000" + ts, "webhook-signature: " + sig1},
		"padded values":        {ct, "webhook-id:   " + id + " \t", "webhook-timestamp: \t" + ts + "  ", "webhook-signature:  " + sig1 + "   " + sig2 + " "},
		"signatures reordered": {ct, "webhook-id: " + id, "webhook-timestamp: " + ts, "webhook-signature: " + sig2 + " " + sig1},
		"one signature":        {ct, "webhook-id: " + id, "webhook-timestamp: " + ts, "webhook-signature: " + sig2},
		"a bogus one first":    {ct, "webhook-id: " + id, "webhook-timestamp: " + ts, "webhook-signature: " + bogus + " v1,AAAA " + sig1},
		"header case, order":   {"WEBHOOK-SIGNATURE: " + sig1, "Webhook-Timestamp: " + ts, "Webhook-Id: " + id, ct},
		"id header repeated":   {ct, "webhook-id: " + id, "webhook-id: msg_other", "webhook-timestamp: " + ts, "webhook-signature: " + sig1},
		"signature repeated":   {ct, "webhook-id: " + id, "webhook-timestamp: " + ts, "webhook-signature: " + sig1, "webhook-signature: " + bogus},
	}
	for name, headers := range variants {
		fresh, calls := receiver()
		require.Equal(t, 204, rawPost(t, fresh, headers, body), "%s: verifies and is handled when new", name)
		require.EqualValues(t, 1, calls.Load(), name)
	}

	srv, calls := receiver()
	require.Equal(t, 204, rawPost(t, srv, original, body))
	for name, headers := range variants {
		code := rawPost(t, srv, headers, body)
		require.Equal(t, 200, code, "%s: answered as already handled", name)
		require.EqualValues(t, 1, calls.Load(), "%s: handled again", name)
	}
}
