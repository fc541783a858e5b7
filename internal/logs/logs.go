// Package logs holds what our logging needs beyond log/slog.
package logs

import (
	"context"
	"log/slog"
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
