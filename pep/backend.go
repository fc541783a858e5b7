package pep

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/authzen"
)

// How the gate talks to the backend beyond single calls of arapclient.Client:
// which failures are answers, which are worth a second try, and what is
// best effort.

// errUncertain means the backend may or may not have the request.
var errUncertain = errors.New("submission outcome unknown")

// retryTransient runs op up to three times, a moment apart, until it
// succeeds or the backend refuses: a replica dying under a call, or a
// balancer without a healthy upstream for a moment, is not worth failing a
// tool call for. Only for operations that are safe to repeat: an
// evaluation, a submission under its Idempotency-Key.
func retryTransient(ctx context.Context, op func() error) error {
	var err error
	for attempt := range 3 {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return errors.Join(err, ctx.Err())
			case <-time.After(backoff(attempt, err)):
			}
		}
		if err = op(); err == nil || refused(err) {
			return err
		}
	}
	return err
}

// backoff is the wait before attempt: 200ms, 400ms, or the backend's
// Retry-After (429, 503) when longer, up to a second: a caller is waiting.
func backoff(attempt int, err error) time.Duration {
	d := time.Duration(attempt*200) * time.Millisecond
	var pe *arapclient.ProblemError
	if errors.As(err, &pe) {
		d = max(d, min(time.Duration(pe.RetryAfter)*time.Second, time.Second))
	}
	return d
}

// backendUnavailable reports whether err says the backend cannot answer
// now: it answered 503 (its database is unavailable), could not be
// reached, or a proxy in front of it could not reach it (502, 504: a
// replica restarting behind the load balancer). The caller may retry.
func backendUnavailable(err error) bool {
	var pe *arapclient.ProblemError
	if errors.As(err, &pe) {
		switch pe.Status {
		case http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout:
			return true
		}
		return false
	}
	var ne net.Error
	return errors.As(err, &ne)
}

// refused reports whether err is the backend's definite answer: a 4xx
// problem other than 429.
func refused(err error) bool {
	var pe *arapclient.ProblemError
	return errors.As(err, &pe) && pe.Status >= 400 && pe.Status < 500 && pe.Status != 429
}

// cancelBackend cancels a backend request, best effort (it expires anyway).
func (g *Gate) cancelBackend(ctx context.Context, cancelURL string) {
	if _, err := g.cfg.Backend.Cancel(ctx, cancelURL, "mcp_task_cancelled"); err != nil && !arapclient.IsProblem(err, authzen.ProblemInvalidTaskState) {
		g.cfg.Log.WarnContext(ctx, "backend cancel failed", "error", err.Error())
	}
}

// schemaCache keeps fetched request schemas for a minute.
var schemaCache = struct {
	sync.Mutex
	m map[string]cachedSchema
}{m: map[string]cachedSchema{}}

type cachedSchema struct {
	doc map[string]any
	at  time.Time
}

// requestSchema fetches (or recalls) the backend's request schema at url.
func (g *Gate) requestSchema(ctx context.Context, url string) (map[string]any, error) {
	schemaCache.Lock()
	c, ok := schemaCache.m[url]
	schemaCache.Unlock()
	if ok && time.Since(c.at) < time.Minute {
		return c.doc, nil
	}
	doc, err := g.cfg.Backend.Schema(ctx, url)
	if err != nil {
		return nil, err
	}
	schemaCache.Lock()
	schemaCache.m[url] = cachedSchema{doc: doc, at: time.Now()}
	schemaCache.Unlock()
	return doc, nil
}
