package pep

import (
	"context"
	"sync"

	"github.com/omcp/arap/mcp/tasks"
)

// changes serves the gateway's listen streams their other opt-ins
// (tasks.Changes): the list changes of what the gateway offers, and
// notifications/resources/updated for the URIs the PDP lets the caller
// read. Only 2026-07-28 clients have such a stream; a 2025-11-25 client of
// this stateless server has no session to carry them.
type changes struct {
	s *Server

	mu    sync.Mutex
	feeds map[*feed]struct{}
}

// Watch accepts the list changes asked for, and of the URIs asked for
// those an upstream offers and takes subscriptions for, and the PDP lets
// the caller read (resources/read, decided as a read is, now); the others
// are silently left out. The upstream is subscribed (once per URI for all
// streams) before Watch returns, so an update after the acknowledgement
// reaches the stream.
func (h *changes) Watch(ctx context.Context, want tasks.Wants) (tasks.Wants, tasks.Feed, error) {
	s := h.s
	got := tasks.Wants{ToolsListChanged: want.ToolsListChanged}
	if s.pass != nil {
		// Accepted while nothing is offered yet too: an upstream that
		// comes to offer prompts or resources is such a change.
		got.PromptsListChanged, got.ResourcesListChanged = want.PromptsListChanged, want.ResourcesListChanged
	}
	f := &feed{h: h, want: got, wake: make(chan struct{}, 1), seen: map[tasks.Note]bool{}}
	if s.pass != nil && len(want.ResourceSubscriptions) > 0 {
		p, _ := ctx.Value(principalKey{}).(Principal)
		for _, uri := range want.ResourceSubscriptions {
			ok, err := s.maySubscribe(ctx, p, uri, f)
			if err != nil {
				f.Close()
				return tasks.Wants{}, nil, err
			}
			if ok {
				got.ResourceSubscriptions = append(got.ResourceSubscriptions, uri)
			}
		}
	}
	if !got.Any() {
		return got, nil, nil
	}
	f.want = got
	h.mu.Lock()
	if h.feeds == nil {
		h.feeds = map[*feed]struct{}{}
	}
	h.feeds[f] = struct{}{}
	h.mu.Unlock()
	return got, f, nil
}

// maySubscribe subscribes f to uri if an upstream offers it and the PDP
// allows p to read it; an error only when the PDP could not decide.
func (s *Server) maySubscribe(ctx context.Context, p Principal, uri string, f *feed) (bool, error) {
	up, ok := s.pass.reg.ResourceOwner(uri)
	if !ok || p.SubjectID == "" || p.anonymous {
		return false, nil
	}
	ev := readEvaluation(uri, up)
	ev.Subject = p.Subject()
	d, err := s.gate.evaluate(ctx, ev)
	if err != nil {
		return false, err
	}
	if !d.Decision {
		return false, nil
	}
	note := tasks.Note{Method: tasks.NotificationResourceUpdated, URI: uri}
	stop, err := s.pass.reg.Subscribe(ctx, up, uri, func() { f.mark(note) })
	if err != nil {
		// Not the error's text: it names the URI, which is the caller's.
		s.log.WarnContext(ctx, "resource subscription not made", "upstream", up)
		return false, nil
	}
	f.mu.Lock()
	f.stops = append(f.stops, stop)
	f.mu.Unlock()
	return true, nil
}

// listChanged tells the streams that opted in that a list changed; method
// is one of the tasks.Notification*ListChanged.
func (h *changes) listChanged(method string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for f := range h.feeds {
		if (method == tasks.NotificationToolsListChanged && f.want.ToolsListChanged) ||
			(method == tasks.NotificationPromptsListChanged && f.want.PromptsListChanged) ||
			(method == tasks.NotificationResourcesListChanged && f.want.ResourcesListChanged) {
			f.mark(tasks.Note{Method: method})
		}
	}
}

// feed is one stream's registration: its pending notes, each at most once
// until taken (a stream needs to hear of a change once, not how often), so
// it is bounded by what the stream asked for.
type feed struct {
	h    *changes
	want tasks.Wants
	wake chan struct{}

	mu      sync.Mutex
	pending []tasks.Note
	seen    map[tasks.Note]bool
	stops   []func()
}

func (f *feed) mark(n tasks.Note) {
	f.mu.Lock()
	if !f.seen[n] {
		f.seen[n] = true
		f.pending = append(f.pending, n)
	}
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

func (f *feed) Wake() <-chan struct{} { return f.wake }

func (f *feed) Take() []tasks.Note {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.pending
	f.pending = nil
	clear(f.seen)
	return out
}

// Close unregisters the stream and drops its resource subscriptions (the
// upstream's own when it was the last to watch the URI).
func (f *feed) Close() {
	f.h.mu.Lock()
	delete(f.h.feeds, f)
	f.h.mu.Unlock()
	f.mu.Lock()
	stops := f.stops
	f.stops = nil
	f.mu.Unlock()
	for _, stop := range stops {
		stop()
	}
}
