package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Verifier checks incoming callbacks: signature (any of the secrets),
// timestamp within the tolerance, and no second handling of a webhook-id. A
// PEP wraps its callback handler with Middleware, or calls Verify, Claim
// and, if its handling fails, Release.
type Verifier struct {
	keys [][]byte
	// Tolerance bounds how far webhook-timestamp may be from now (default
	// 5 minutes); older or future-dated messages are refused.
	Tolerance time.Duration
	// MaxBody bounds the body read (default 1 MiB).
	MaxBody int64
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Replay remembers claimed webhook-ids. NewVerifier sets one in this
	// process's memory; replicas of a receiver share one store instead (a
	// database table), or a copy delivered to each of two replicas would be
	// handled twice.
	Replay ReplayStore
}

// ReplayStore remembers claimed webhook-ids. Claim records id until the
// given time and reports true, or reports false and records nothing when id
// is already claimed until a time still to come; it must be atomic, so that
// of two concurrent claims of one id exactly one is true. Release forgets a
// claim, so that a retry after a failed handling is not taken for a replay.
// Done marks a claim whose handling succeeded, and Handled reports whether a
// live claim is so marked: a copy of a handled message is answered 2xx, as
// a copy of one being handled is not, so a sender that lost the first 2xx
// stops retrying.
type ReplayStore interface {
	Claim(ctx context.Context, id string, until time.Time) (bool, error)
	Release(ctx context.Context, id string) error
	Done(ctx context.Context, id string) error
	Handled(ctx context.Context, id string) (bool, error)
}

// NewVerifier returns a Verifier for one or more whsec_ secrets, remembering
// webhook-ids in memory.
func NewVerifier(secrets ...string) (*Verifier, error) {
	if len(secrets) == 0 {
		return nil, errors.New("webhook: a verifier needs at least one secret")
	}
	v := &Verifier{Tolerance: 5 * time.Minute, MaxBody: 1 << 20}
	v.Replay = &memoryReplay{now: v.now, until: map[string]time.Time{}, done: map[string]bool{}}
	for _, s := range secrets {
		k, err := ParseSecret(s)
		if err != nil {
			return nil, err
		}
		v.keys = append(v.keys, k)
	}
	return v, nil
}

// Verification errors.
var (
	ErrMissingHeaders = errors.New("webhook: webhook-id, webhook-timestamp and webhook-signature are required")
	ErrTimestamp      = errors.New("webhook: webhook-timestamp is outside the tolerance")
	ErrSignature      = errors.New("webhook: no signature matches")
	ErrReplay         = errors.New("webhook: this webhook-id was already claimed")
	// ErrHandled: the id was claimed and its handling succeeded.
	ErrHandled = errors.New("webhook: this webhook-id was already handled")
)

func (v *Verifier) now() time.Time {
	if v.Now != nil {
		return v.Now()
	}
	return time.Now()
}

// Verify checks a callback's headers against its body and returns its
// webhook-id. It does not look at the replay memory: Claim the id before
// handling the callback.
func (v *Verifier) Verify(h http.Header, body []byte) (string, error) {
	id, ts, sigs := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if id == "" || ts == "" || sigs == "" {
		return "", ErrMissingHeaders
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return "", fmt.Errorf("%w: not a number", ErrTimestamp)
	}
	if d := v.now().Sub(time.Unix(sec, 0)); d > v.Tolerance || d < -v.Tolerance {
		return "", ErrTimestamp
	}
	for _, k := range v.keys {
		want := []byte(Sign(k, id, sec, body))
		for _, got := range strings.Fields(sigs) {
			if hmac.Equal([]byte(got), want) {
				return id, nil
			}
		}
	}
	return "", ErrSignature
}

// Claim takes id for handling, once for every receiver sharing the replay
// store: ErrReplay if it is already taken. The claim lasts twice the
// tolerance, past which the timestamp check refuses any copy of a message
// signed before the claim.
func (v *Verifier) Claim(ctx context.Context, id string) error {
	if v.Replay == nil {
		return errors.New("webhook: the verifier has no replay store")
	}
	ok, err := v.Replay.Claim(ctx, id, v.now().Add(2*v.Tolerance))
	if err != nil {
		return fmt.Errorf("webhook: claim webhook-id: %w", err)
	}
	if !ok {
		if done, err := v.Replay.Handled(ctx, id); err == nil && done {
			return ErrHandled
		}
		return ErrReplay
	}
	return nil
}

// Release gives up the claim of id after a failed handling, so that the
// sender's retry is handled.
func (v *Verifier) Release(ctx context.Context, id string) error {
	if err := v.Replay.Release(ctx, id); err != nil {
		return fmt.Errorf("webhook: release webhook-id: %w", err)
	}
	return nil
}

// afterKey is the context key of the work a handler leaves for after its
// answer (AfterHandled).
type afterKey struct{}

type afterList struct{ fs []func() }

// AfterHandled has f run once the message being handled in ctx has been
// marked handled and its 2xx answer sent, and not at all if it is not
// handled: so the work a message starts in the background cannot die with
// its receiver before the sender has its answer, leaving the message
// claimed, unanswered and refused as "being handled" until the claim
// expires. It reports false outside Middleware (f is then the caller's to
// run). f runs on the request's goroutine and must not block.
func AfterHandled(ctx context.Context, f func()) bool {
	l, ok := ctx.Value(afterKey{}).(*afterList)
	if ok {
		l.fs = append(l.fs, f)
	}
	return ok
}

// Middleware verifies each request and claims its webhook-id before next
// sees it: 401 for a bad signature or timestamp, 200 without calling next
// for a copy of a message already handled (the sender lost our answer),
// 409 for a copy of one being handled right now, 503 when the replay store
// cannot answer (the sender retries). The claim is released when next does
// not answer 2xx (or panics), so the retry gets through, and marked done
// when it does; then the answer is sent and what next left for after it
// (AfterHandled) runs. next reads the body as usual.
func (v *Verifier) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, v.MaxBody))
		if err != nil {
			http.Error(w, "callback body too large", http.StatusRequestEntityTooLarge)
			return
		}
		id, err := v.Verify(r.Header, body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		switch err := v.Claim(r.Context(), id); {
		case errors.Is(err, ErrHandled):
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = io.WriteString(w, "already handled\n")
			return
		case errors.Is(err, ErrReplay):
			http.Error(w, err.Error(), http.StatusConflict)
			return
		case err != nil:
			http.Error(w, "callback replay check unavailable; retry later", http.StatusServiceUnavailable)
			return
		}
		handled := false
		defer func() {
			if !handled {
				// Best effort: if it fails, the claim simply lasts until it
				// expires, and the sender's later retries get through then.
				_ = v.Release(context.WithoutCancel(r.Context()), id)
			}
		}()
		after := &afterList{}
		r = r.WithContext(context.WithValue(r.Context(), afterKey{}, after))
		r.Body = io.NopCloser(bytes.NewReader(body))
		rec := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(rec, r)
		handled = rec.status >= 200 && rec.status < 300
		if handled {
			// Best effort: unmarked, a copy is answered 409 until the claim
			// expires, as before.
			_ = v.Replay.Done(context.WithoutCancel(r.Context()), id)
			_ = http.NewResponseController(w).Flush()
			for _, f := range after.fs {
				f()
			}
		}
	})
}

// memoryReplay is a ReplayStore in one process's memory.
type memoryReplay struct {
	now   func() time.Time
	mu    sync.Mutex
	until map[string]time.Time
	done  map[string]bool
}

func (m *memoryReplay) Claim(_ context.Context, id string, until time.Time) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if u, ok := m.until[id]; ok && u.After(now) {
		return false, nil
	}
	if len(m.until) >= 1024 {
		for id, u := range m.until {
			if !u.After(now) {
				delete(m.until, id)
				delete(m.done, id)
			}
		}
	}
	m.until[id] = until
	delete(m.done, id)
	return true, nil
}

func (m *memoryReplay) Release(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.until, id)
	delete(m.done, id)
	return nil
}

func (m *memoryReplay) Done(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.until[id]; ok {
		m.done[id] = true
	}
	return nil
}

func (m *memoryReplay) Handled(_ context.Context, id string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.done[id] && m.until[id].After(m.now()), nil
}

type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (s *statusWriter) WriteHeader(code int) {
	if !s.wrote {
		s.status, s.wrote = code, true
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	s.wrote = true
	return s.ResponseWriter.Write(b)
}
