package pep

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/authzen"
)

// TestRetryTransient: an evaluation that meets a balancer without a healthy
// upstream (502) is tried again and succeeds; a refusal (4xx) is not
// repeated; three failures give up with the last error.
func TestRetryTransient(t *testing.T) {
	var calls, failFirst atomic.Int32
	var status atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		if n <= failFirst.Load() {
			w.WriteHeader(int(status.Load()))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"decision":true}`))
	}))
	t.Cleanup(srv.Close)
	backend := &arapclient.Client{BaseURL: srv.URL, HTTP: srv.Client()}
	evaluate := func() (authzen.Decision, error) {
		var d authzen.Decision
		err := retryTransient(context.Background(), func() (err error) {
			d, err = backend.Evaluate(context.Background(), authzen.EvaluationRequest{})
			return err
		})
		return d, err
	}

	calls.Store(0)
	failFirst.Store(2)
	status.Store(http.StatusBadGateway)
	d, err := evaluate()
	require.NoError(t, err)
	require.True(t, d.Decision)
	require.EqualValues(t, 3, calls.Load(), "two 502s, then the answer")

	calls.Store(0)
	failFirst.Store(3)
	_, err = evaluate()
	require.Error(t, err)
	require.False(t, refused(err))
	require.EqualValues(t, 3, calls.Load(), "three attempts at most")

	calls.Store(0)
	failFirst.Store(3)
	status.Store(http.StatusForbidden)
	_, err = evaluate()
	require.True(t, refused(err))
	require.EqualValues(t, 1, calls.Load(), "a refusal is an answer, not repeated")

	calls.Store(0)
	status.Store(http.StatusTooManyRequests)
	_, err = evaluate()
	require.False(t, refused(err), "429 asks to come back later")
	require.EqualValues(t, 3, calls.Load())

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tries := 0
	err = retryTransient(ctx, func() error { tries++; return context.DeadlineExceeded })
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 1, tries, "a cancelled call does not wait out the backoff")
}
