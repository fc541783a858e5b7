package pep_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/pep"
)

// TestCallbackAnsweredBeforeItsAdvance (issue 35): the advance a callback
// wakes starts only once the callback has been answered and its webhook-id
// marked handled (Wake, webhook.AfterHandled). Started before, a process
// that died during it would leave the message claimed and unanswered, and
// the backend's retries refused as "being handled" until the claim expires.
// The advance is held at its first step (the status read) until the answer
// has been written, so a wake-up started earlier is seen holding its slot
// when the answer is written, however the goroutines are scheduled.
func TestCallbackAnsweredBeforeItsAdvance(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var p *stack
	atAnswer := make(chan int, 1) // wake-ups started when the callback's answer was written
	answered := make(chan struct{})
	ran := make(chan struct{}, 1)
	p = newPEP(t, pepOptions{
		wrap: func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == pep.PathCallback {
					w = &answerWatch{ResponseWriter: w, written: func() { atAnswer <- p.gate.WakeUps(); close(answered) }}
				}
				h.ServeHTTP(w, r)
			})
		},
		run: func(next func(context.Context, pep.Invocation) (pep.Output, error)) func(context.Context, pep.Invocation) (pep.Output, error) {
			return func(ctx context.Context, x pep.Invocation) (pep.Output, error) {
				ran <- struct{}{}
				return next(ctx, x)
			}
		}})
	id := p.transfer(t, 50602)
	req := p.request(t, id)
	p.approve(t, req, time.Time{})

	handledAtAdvance := make(chan bool, 1)
	p.onBackend(func(r *http.Request, _ []byte) {
		if r.Method == http.MethodGet && r.URL.Path == authzen.PathRequests+"/"+req {
			select {
			case <-answered: // an advance started early waits here, holding its slot
			case <-r.Context().Done(): // Stop
				return
			}
			var handled bool
			if err := p.db.QueryRow(ctx, `SELECT bool_and(handled) FROM pep.webhook_ids`).Scan(&handled); err != nil {
				t.Errorf("read the webhook ids: %v", err)
			}
			select {
			case handledAtAdvance <- handled:
			default: // a later read: the first one is the advance's start
			}
		}
	})
	require.Equal(t, http.StatusNoContent, p.callback(t, id, req, "approved"))
	require.Zero(t, wait(t, atAnswer, "the callback's answer"), "no wake-up started before the callback was answered")
	require.True(t, wait(t, handledAtAdvance, "the woken task's status read"), "the callback was marked handled before its advance")
	wait(t, ran, "the woken task's run")
	p.gate.Stop() // waits for the wake-up to record its outcome
	require.Equal(t, pep.ApprovedExecuted, disposition(t, p.task(t, id)))
	require.Equal(t, 1, p.ledger(t, id))
}

// answerWatch calls written once, as the answer's status is written.
type answerWatch struct {
	http.ResponseWriter
	once    sync.Once
	written func()
}

func (w *answerWatch) WriteHeader(code int) {
	w.once.Do(w.written)
	w.ResponseWriter.WriteHeader(code)
}

func (w *answerWatch) Write(b []byte) (int, error) {
	w.once.Do(w.written)
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the server's writer (Flush).
func (w *answerWatch) Unwrap() http.ResponseWriter { return w.ResponseWriter }
