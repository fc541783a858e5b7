package announce

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/internal/pglisten"
)

// Listener is the application_name of a Hub's listening connection.
const Listener = "arap-decision-inputs-listener"

// ErrNotListening refuses a subscription while the hub does not hear
// Channel: the subscriber would miss what changed meanwhile.
var ErrNotListening = errors.New("announce: not listening for changes now")

// Change is one announcement as a subscriber gets it.
type Change struct {
	// Epoch counts the announcements this hub has heard; it only grows.
	Epoch uint64
	// Kind is what changed (Policy, Attributes, Directory, Client).
	Kind string
	// Revoked: the change revoked the subscriber's own client; its stream
	// ends after this change.
	Revoked bool
}

// Hub listens on Channel (a host service: Start, Stop) and passes each
// announcement on to its subscribers. A subscription exists only while the
// LISTEN holds: when the connection is lost every subscription ends, and
// none is taken until it holds again.
type Hub struct {
	DB  *pgxpool.Pool
	Log *slog.Logger // nil: no warnings
	// Settle is how long after a change this replica may still decide from
	// inputs older than it (its attributes' snapshot bound): a subscriber
	// keeps no decision made sooner after a change (or after subscribing).
	Settle time.Duration
	// Keepalive is how often a quiet stream says it is alive; default
	// DefaultKeepalive.
	Keepalive time.Duration

	mu    sync.Mutex
	live  bool
	ended bool
	epoch uint64
	subs  map[*Sub]struct{}
	stop  context.CancelFunc
	done  chan struct{}
	// heard, if set (tests), sees every announcement after it is passed on.
	heard func(Change)
}

// Start listens until Stop.
func (h *Hub) Start(context.Context) error {
	ctx, stop := context.WithCancel(context.Background())
	h.stop, h.done = stop, make(chan struct{})
	l := pglisten.Listener{DB: h.DB, Channel: Channel, Name: Listener,
		What: "decision input changes (front-ends' decision caches unused meanwhile)", Log: h.Log,
		Live: h.setLive, Heard: h.hear}
	go func() {
		defer close(h.done)
		l.Run(ctx, nil)
	}()
	return nil
}

// Stop ends the listener and every subscription.
func (h *Hub) Stop() {
	h.End()
	if h.stop != nil {
		h.stop()
		<-h.done
	}
}

// End ends every subscription and refuses new ones (the server is shutting
// down: a stream never ends by itself).
func (h *Hub) End() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ended = true
	h.endAllLocked()
}

// DefaultKeepalive is the default of Hub.Keepalive.
const DefaultKeepalive = 5 * time.Second

// KeepaliveEvery is Keepalive or its default.
func (h *Hub) KeepaliveEvery() time.Duration { return cmp.Or(h.Keepalive, DefaultKeepalive) }

// Drop ends every subscription (their subscribers must assume they missed
// a change: one could not be announced) and keeps taking new ones.
func (h *Hub) Drop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.endAllLocked()
}

// Live reports whether the hub hears Channel now.
func (h *Hub) Live() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.live
}

func (h *Hub) setLive(live bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.live = live
	if !live {
		h.endAllLocked()
	}
}

func (h *Hub) endAllLocked() {
	for s := range h.subs {
		s.endLocked()
	}
	clear(h.subs)
}

func (h *Hub) hear(payload string) {
	kind, detail, _ := strings.Cut(payload, ":")
	h.mu.Lock()
	h.epoch++
	c := Change{Epoch: h.epoch, Kind: kind}
	for s := range h.subs {
		c := c
		c.Revoked = kind == Client && detail != "" && detail == s.client
		s.put(c)
		if c.Revoked {
			delete(h.subs, s) // its stream ends once it has written c
		}
	}
	heard := h.heard
	h.mu.Unlock()
	if heard != nil {
		heard(c)
	}
}

// Subscribe starts a subscription for API client client (its revocation
// ends it), or refuses with ErrNotListening. It returns the epoch it starts
// at: every change after it reaches the subscription.
func (h *Hub) Subscribe(client string) (*Sub, uint64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.live || h.ended {
		return nil, 0, ErrNotListening
	}
	s := &Sub{h: h, client: client, wake: make(chan struct{}, 1), done: make(chan struct{})}
	if h.subs == nil {
		h.subs = map[*Sub]struct{}{}
	}
	h.subs[s] = struct{}{}
	return s, h.epoch, nil
}

// Sub is one subscription: the latest change not yet taken (a subscriber
// needs to know that something changed, not how often), and whether it
// has ended.
type Sub struct {
	h      *Hub
	client string
	wake   chan struct{}
	done   chan struct{}

	mu      sync.Mutex
	pending *Change
	ended   bool
}

func (s *Sub) put(c Change) {
	s.mu.Lock()
	if p := s.pending; p == nil || !p.Revoked {
		s.pending = &c
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// endLocked ends the subscription; the hub's lock is held.
func (s *Sub) endLocked() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		s.ended = true
		close(s.done)
	}
}

// Wake is ready when a change is pending.
func (s *Sub) Wake() <-chan struct{} { return s.wake }

// Done is closed when the subscription has ended (the hub stopped
// listening, or is shutting down): the subscriber must assume it missed
// changes.
func (s *Sub) Done() <-chan struct{} { return s.done }

// Take returns the pending change, if any.
func (s *Sub) Take() (Change, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending == nil {
		return Change{}, false
	}
	c := *s.pending
	s.pending = nil
	return c, true
}

// Close ends the subscription.
func (s *Sub) Close() {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	delete(s.h.subs, s)
	s.endLocked()
}
