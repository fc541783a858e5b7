// Package logs holds what our logging needs beyond log/slog.
package logs

import (
	"context"
	"crypto/rand"
	"log/slog"
	"net/http"
	"strings"
)

// Quiet returns l without records below min. Libraries (River, the MCP SDK)
// report routine activity at info, which would drown our own logs.
func Quiet(l *slog.Logger, min slog.Level) *slog.Logger {
	return slog.New(minLevel{l.Handler(), min})
}

type minLevel struct {
	slog.Handler
	min slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(a []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(a), h.min}
}

func (h minLevel) WithGroup(g string) slog.Handler { return minLevel{h.Handler.WithGroup(g), h.min} }

// RequestID is the request id for logs: the caller's X-Request-ID when it is
// a short printable token, else a fresh random one (a header value is never
// logged as it came).
func RequestID(given string) string {
	if given == "" || len(given) > 200 || strings.ContainsFunc(given, func(c rune) bool { return c < 0x20 || c > 0x7e }) {
		return rand.Text()
	}
	return given
}

// StatusRecorder notes the status and size of a response for the access
// log. Unwrap lets http.ResponseController reach the connection (flushes,
// deadlines of event streams).
type StatusRecorder struct {
	http.ResponseWriter
	Status int // 200 when the handler wrote without WriteHeader
	Bytes  int
}

func (s *StatusRecorder) WriteHeader(code int) {
	if s.Status == 0 {
		s.Status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *StatusRecorder) Write(b []byte) (int, error) {
	if s.Status == 0 {
		s.Status = http.StatusOK
	}
	n, err := s.ResponseWriter.Write(b)
	s.Bytes += n
	return n, err
}

func (s *StatusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
