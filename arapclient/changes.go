package arapclient

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/omcp/arap/authzen"
)

// Change is one event of the backend's change stream (Changes).
type Change struct {
	// Hello marks the stream's first event: every change after it reaches
	// the stream.
	Hello bool
	// Epoch counts the changes the answering replica has heard; it only
	// grows within a stream.
	Epoch uint64
	// Kind is what changed (not on Hello): policy, attributes, directory,
	// client.
	Kind string
	// Keepalive is how often a quiet stream says it is alive, and Settle
	// how long after a change a decision may still have been made from
	// inputs older than it (Hello only).
	Keepalive, Settle time.Duration
}

// ErrStreamSilent ends a change stream that said nothing for three of its
// keepalives (a connection lost without a word).
var ErrStreamSilent = errors.New("arapclient: the change stream went silent")

// helloWithin bounds the wait for a stream's hello.
const helloWithin = 10 * time.Second

// Changes follows the backend's change stream (GET /v1/decisions/changes,
// scope evaluate), the announcements of whatever may change a decision the
// PDP marked cacheable (authzen.CtxCache), calling on for each event in
// order, until ctx ends or the stream does. It always returns why: the
// refusal (a *ProblemError), ErrStreamSilent, or the stream's end. A PEP
// reuses such decisions only between a Hello and the return.
func (c *Client) Changes(ctx context.Context, on func(Change)) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url(authzen.PathDecisionChanges), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	req.Header.Set("Accept", "text/event-stream")
	// The client's own, without its timeout: a stream lasts.
	hc := *c.http()
	hc.Timeout = 0
	silent := time.AfterFunc(helloWithin, func() { cancel(ErrStreamSilent) })
	defer silent.Stop()
	resp, err := hc.Do(req)
	if err != nil {
		return cause(ctx, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
		return problemFrom(resp, raw)
	}
	quiet := helloWithin
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	var event, data string
	for sc.Scan() {
		silent.Reset(quiet)
		line := sc.Text()
		switch {
		case line == "":
			if event == "" {
				continue
			}
			ch, err := parseChange(event, data)
			if err != nil {
				return err
			}
			if ch.Hello && ch.Keepalive > 0 {
				quiet = 3 * ch.Keepalive
				silent.Reset(quiet)
			}
			on(ch)
			event, data = "", ""
		case strings.HasPrefix(line, ":"):
			// A keepalive.
		case strings.HasPrefix(line, "event:"):
			event = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "data:"):
			data += strings.TrimSpace(strings.TrimPrefix(line, "data:"))
		}
	}
	if err := sc.Err(); err != nil {
		return cause(ctx, err)
	}
	return cause(ctx, errors.New("arapclient: the change stream ended"))
}

// cause is why ctx ended, if it did, else err.
func cause(ctx context.Context, err error) error {
	if c := context.Cause(ctx); c != nil {
		return c
	}
	return err
}

func parseChange(event, data string) (Change, error) {
	var d struct {
		Epoch     uint64  `json:"epoch"`
		Kind      string  `json:"kind"`
		Keepalive float64 `json:"keepalive"`
		Settle    float64 `json:"settle"`
	}
	if err := json.Unmarshal([]byte(data), &d); err != nil {
		return Change{}, fmt.Errorf("arapclient: change stream: event %s: %w", event, err)
	}
	seconds := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	switch event {
	case authzen.EventHello:
		return Change{Hello: true, Epoch: d.Epoch, Keepalive: seconds(d.Keepalive), Settle: seconds(d.Settle)}, nil
	case authzen.EventChange:
		return Change{Epoch: d.Epoch, Kind: d.Kind}, nil
	}
	// An event this client does not know may change a decision too.
	return Change{Epoch: d.Epoch, Kind: event}, nil
}
