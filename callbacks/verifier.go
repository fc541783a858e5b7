package callbacks

import (
	"bytes"
	"crypto/hmac"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/omcp/arap/internal/clean"
)

// Verifier checks incoming callbacks: signature (any of the secrets),
// timestamp within the tolerance, and no replay of a webhook-id already
// accepted. A PEP wraps its callback handler with Middleware, or calls
// Verify and then Accept.
type Verifier struct {
	keys [][]byte
	// Tolerance bounds how far webhook-timestamp may be from now (default
	// 5 minutes); older or future-dated messages are refused.
	Tolerance time.Duration
	// MaxBody bounds the body read (default 1 MiB).
	MaxBody int64
	// Now is the clock (time.Now when nil).
	Now func() time.Time

	mu   sync.Mutex
	seen map[string]time.Time // accepted webhook-ids, until they age out
}

// NewVerifier returns a Verifier for one or more whsec_ secrets.
func NewVerifier(secrets ...string) (*Verifier, error) {
	if len(secrets) == 0 {
		return nil, errors.New("callbacks: a verifier needs at least one secret")
	}
	v := &Verifier{Tolerance: 5 * time.Minute, MaxBody: 1 << 20, seen: map[string]time.Time{}}
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
	ErrMissingHeaders = errors.New("callbacks: webhook-id, webhook-timestamp and webhook-signature are required")
	ErrTimestamp      = errors.New("callbacks: webhook-timestamp is outside the tolerance")
	ErrSignature      = errors.New("callbacks: no signature matches")
	ErrReplay         = errors.New("callbacks: this webhook-id was already accepted")
)

func (v *Verifier) now() time.Time {
	if v.Now != nil {
		return v.Now()
	}
	return time.Now()
}

// Verify checks a callback's headers against its body and returns its
// webhook-id. It does not remember the id: call Accept once the callback has
// been handled, so a retry after a failed handling is not taken for a replay.
func (v *Verifier) Verify(h http.Header, body []byte) (string, error) {
	id, ts, sigs := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if id == "" || ts == "" || sigs == "" {
		return "", ErrMissingHeaders
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return "", fmt.Errorf("%w: not a number", ErrTimestamp)
	}
	now := v.now()
	if d := now.Sub(time.Unix(sec, 0)); d > v.Tolerance || d < -v.Tolerance {
		return "", ErrTimestamp
	}
	ok := false
	for _, k := range v.keys {
		want := []byte(Sign(k, id, sec, body))
		for _, got := range strings.Fields(sigs) {
			if hmac.Equal([]byte(got), want) {
				ok = true
			}
		}
	}
	if !ok {
		return "", ErrSignature
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.expire(now)
	if _, dup := v.seen[id]; dup {
		return "", ErrReplay
	}
	return id, nil
}

// Accept remembers id until it is older than twice the tolerance, after
// which its timestamp check would refuse a replay anyway.
func (v *Verifier) Accept(id string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.seen[id] = v.now().Add(2 * v.Tolerance)
}

func (v *Verifier) expire(now time.Time) {
	if len(v.seen) < 1024 {
		return
	}
	for id, until := range v.seen {
		if now.After(until) {
			delete(v.seen, id)
		}
	}
}

// ErrBody refuses a callback body that does not name a task.
var ErrBody = errors.New("callbacks: the body must be a JSON object with a state and a task id, as text of at most 255 bytes")

// ParseBody decodes a verified callback's body: its state (what the PEP
// registered) and task id must be present and be text a receiver can look
// up, at most 255 bytes of valid UTF-8 without NUL.
func ParseBody(raw []byte) (Body, error) {
	var b Body
	if json.Unmarshal(raw, &b) != nil {
		return Body{}, ErrBody
	}
	for _, s := range []string{b.State, b.Task.ID} {
		if s == "" || len(s) > 255 || clean.Text(s) != nil {
			return Body{}, ErrBody
		}
	}
	return b, nil
}

// Middleware verifies each request before next sees it: 401 for a bad
// signature or timestamp, 409 for a replay; the id is remembered only when
// next answers 2xx. next reads the body as usual.
func (v *Verifier) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, v.MaxBody))
		if err != nil {
			http.Error(w, "callback body too large", http.StatusRequestEntityTooLarge)
			return
		}
		id, err := v.Verify(r.Header, body)
		switch {
		case errors.Is(err, ErrReplay):
			http.Error(w, err.Error(), http.StatusConflict)
			return
		case err != nil:
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rec := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(rec, r)
		if rec.status >= 200 && rec.status < 300 {
			v.Accept(id)
		}
	})
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
