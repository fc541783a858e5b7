package arapclient

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/webhook"
)

// WaitOptions tune Wait. The zero value polls at the pace the service asks.
type WaitOptions struct {
	// Callbacks, when set, wakes the wait as soon as a verified callback
	// for the task arrives (submit with a Callback to its endpoint); the
	// status endpoint is read then, and stays the only answer believed.
	Callbacks *Callbacks
	// Interval is the pause between polls when the service sends no
	// Retry-After (default 5 seconds).
	Interval time.Duration
	// MaxInterval caps any pause, a Retry-After included (default 5
	// minutes), so that a wrong header cannot park the wait for a day.
	MaxInterval time.Duration

	// after is the timer (time.After when nil); tests observe the pauses.
	after func(time.Duration) <-chan time.Time
}

// Terminal reports whether a task status is final: every status but pending.
func Terminal(status string) bool { return status != authzen.StatusPending }

// Wait reads the task's status until it is final, and returns that status
// (an approved one carries the approval for Reevaluate). Between reads it
// pauses as long as the service's Retry-After asks (within MaxInterval), or
// until a verified callback for the task arrives. It stops with ctx's error
// when ctx ends; a refusal (such as unknown_task once the request is purged)
// ends it with that error.
func (c *Client) Wait(ctx context.Context, task authzen.Task, opts WaitOptions) (authzen.TaskResponse, error) {
	if task.StatusEndpoint == "" {
		return authzen.TaskResponse{}, errors.New("arapclient: the task has no status endpoint")
	}
	interval, maxInterval, after := opts.Interval, opts.MaxInterval, opts.after
	if interval <= 0 {
		interval = 5 * time.Second
	}
	if maxInterval <= 0 {
		maxInterval = 5 * time.Minute
	}
	if after == nil {
		after = time.After
	}
	var woken <-chan struct{}
	if opts.Callbacks != nil {
		w, stop := opts.Callbacks.subscribe(task.ID)
		defer stop()
		woken = w
	}
	for {
		tr, ra, err := c.Status(ctx, task.StatusEndpoint)
		if err != nil {
			return tr, err
		}
		if Terminal(tr.Task.Status) {
			return tr, nil
		}
		pause := interval
		if ra > 0 {
			pause = ra
		}
		pause = min(pause, maxInterval)
		select {
		case <-ctx.Done():
			return tr, ctx.Err()
		case <-after(pause):
		case <-woken:
		}
	}
}

// Callbacks receives the service's callbacks and wakes the waits of the
// tasks they name. It is an http.Handler: mount it at the callback endpoint
// registered for the client. Every callback is verified (Standard Webhooks
// signature with the client's webhook secret, timestamp tolerance, each
// webhook-id once) before it wakes anything; an unverified one is answered
// 401 and wakes nothing. A callback only wakes: Wait then reads the status
// endpoint, which stays authoritative.
type Callbacks struct {
	verifier *webhook.Verifier
	handler  http.Handler

	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{}
}

// NewCallbacks returns a receiver for callbacks signed with one of the
// given whsec_ secrets (more than one while a secret is being rotated).
func NewCallbacks(secrets ...string) (*Callbacks, error) {
	v, err := webhook.NewVerifier(secrets...)
	if err != nil {
		return nil, err
	}
	cb := &Callbacks{verifier: v, waiters: map[string]map[chan struct{}]struct{}{}}
	cb.handler = v.Middleware(http.HandlerFunc(cb.receive))
	return cb, nil
}

// Verifier is the webhook verifier, to tune its tolerance or give replicas
// of a receiver a shared replay store.
func (cb *Callbacks) Verifier() *webhook.Verifier { return cb.verifier }

// ServeHTTP verifies a callback and wakes the waits of its task.
func (cb *Callbacks) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	cb.handler.ServeHTTP(w, r)
}

// receive handles a verified callback.
func (cb *Callbacks) receive(w http.ResponseWriter, r *http.Request) {
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "read body", http.StatusBadRequest)
		return
	}
	b, err := webhook.ParseBody(raw)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	cb.wake(b.Task.ID)
	w.WriteHeader(http.StatusNoContent)
}

// wake signals every wait on task id.
func (cb *Callbacks) wake(id string) {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	for ch := range cb.waiters[id] {
		select {
		case ch <- struct{}{}:
		default: // already signalled and not yet read
		}
	}
}

// subscribe registers a wait on task id.
func (cb *Callbacks) subscribe(id string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	cb.mu.Lock()
	if cb.waiters[id] == nil {
		cb.waiters[id] = map[chan struct{}]struct{}{}
	}
	cb.waiters[id][ch] = struct{}{}
	cb.mu.Unlock()
	return ch, func() {
		cb.mu.Lock()
		delete(cb.waiters[id], ch)
		if len(cb.waiters[id]) == 0 {
			delete(cb.waiters, id)
		}
		cb.mu.Unlock()
	}
}
