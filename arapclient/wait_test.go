package arapclient_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/webhook"
)

// TestWaitHonoursRetryAfter: between polls of a pending task Wait pauses
// exactly as long as the status endpoint's Retry-After says (5 s from the
// backend), not its own interval, and never longer than MaxInterval.
func TestWaitHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	_, pep, _ := setup(t)
	call := transfer(50000)
	d, err := pep.Evaluate(context.Background(), call)
	require.NoError(t, err)
	ar, _ := arapclient.Requestable(call, d)
	tr, err := pep.Submit(context.Background(), ar, arapclient.SubmitOptions{})
	require.NoError(t, err)

	pauses := func(o arapclient.WaitOptions) []time.Duration {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var seen []time.Duration
		// Each pause ends at once, twice; the third ends the wait.
		o = arapclient.WithTimer(o, func(d time.Duration) <-chan time.Time {
			seen = append(seen, d)
			ch := make(chan time.Time, 1)
			if len(seen) < 3 {
				ch <- time.Time{}
			} else {
				cancel()
			}
			return ch
		})
		_, err := pep.Wait(ctx, tr.Task, o)
		require.ErrorIs(t, err, context.Canceled)
		return seen
	}
	require.Equal(t, []time.Duration{5 * time.Second, 5 * time.Second, 5 * time.Second},
		pauses(arapclient.WaitOptions{Interval: 50 * time.Millisecond}), "Retry-After, not the interval")
	require.Equal(t, []time.Duration{2 * time.Second, 2 * time.Second, 2 * time.Second},
		pauses(arapclient.WaitOptions{MaxInterval: 2 * time.Second}), "bounded by MaxInterval")
}

// TestCallbacksWakeOnlyWhenVerified: a callback wakes the waits of its task
// only when its signature verifies with the client's secret; a forged or
// unsigned one is answered 401 and wakes nothing, and a replayed one is
// answered 200 (handled already) and wakes nothing either.
func TestCallbacksWakeOnlyWhenVerified(t *testing.T) {
	t.Parallel()
	cbs, err := arapclient.NewCallbacks(dev.PEPWebhookSecret)
	require.NoError(t, err)
	woken, stop := cbs.Subscribe("arq_1")
	defer stop()
	other, stopOther := cbs.Subscribe("arq_2")
	defer stopOther()

	body := `{"state":"s1","task":{"id":"arq_1","status":"approved","status_endpoint":"http://x/access/v1/requests/arq_1"}}`
	send := func(secret, id string) int {
		key, err := webhook.ParseSecret(secret)
		require.NoError(t, err)
		ts := time.Now().Unix()
		r := httptest.NewRequest(http.MethodPost, "/arap", strings.NewReader(body))
		r.Header.Set(webhook.HeaderID, id)
		r.Header.Set(webhook.HeaderTimestamp, strconv.FormatInt(ts, 10))
		r.Header.Set(webhook.HeaderSignature, webhook.Sign(key, id, ts, []byte(body)))
		w := httptest.NewRecorder()
		cbs.ServeHTTP(w, r)
		return w.Code
	}
	signaled := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}

	require.Equal(t, http.StatusUnauthorized, send(webhook.NewSecret(), "msg_forged"), "signed with another secret")
	require.False(t, signaled(woken), "a forged callback wakes nothing")
	unsigned := httptest.NewRequest(http.MethodPost, "/arap", strings.NewReader(body))
	w := httptest.NewRecorder()
	cbs.ServeHTTP(w, unsigned)
	require.Equal(t, http.StatusUnauthorized, w.Code)
	require.False(t, signaled(woken), "an unsigned callback wakes nothing")

	require.Equal(t, http.StatusNoContent, send(dev.PEPWebhookSecret, "msg_1"))
	require.True(t, signaled(woken), "a verified callback wakes its task's wait")
	require.False(t, signaled(other), "and no other")
	require.Equal(t, http.StatusOK, send(dev.PEPWebhookSecret, "msg_1"), "a replay: answered as handled")
	require.False(t, signaled(woken))
}
