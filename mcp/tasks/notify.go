package tasks

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/internal/pglisten"
)

// Channel is the PostgreSQL notification channel on which the Store
// announces, in the same transaction, every task it creates or changes; the
// payload is the task id.
const Channel = "pep_tasks"

// ListenConfig bounds subscriptions/listen streams.
type ListenConfig struct {
	// MaxStreams bounds the listen streams one principal may hold open on
	// this process at once; default 10.
	MaxStreams int
	// MaxLifetime ends a listen stream (with its result, so the client
	// knows to listen again); default 30 minutes.
	MaxLifetime time.Duration
	// Resync is how often a stream re-reads its tasks whatever it was told
	// (a lost notification only delays) and sends an SSE keep-alive;
	// default 30 seconds.
	Resync time.Duration
	Log    *slog.Logger
}

// Notifier delivers task changes to listen streams, event-driven: one
// connection per process LISTENs on Channel and wakes the streams
// subscribed to the task named, so an idle stream costs PostgreSQL nothing
// but its slow resync. It is a service: Start it before serving listen
// streams and Stop it to end them.
type Notifier struct {
	db  *pgxpool.Pool
	cfg ListenConfig

	mu          sync.Mutex
	byTask      map[string]map[*subscription]struct{}
	byPrincipal map[string]int
	stopped     bool
	ended       chan struct{} // closed by Stop: every stream ends

	cancel context.CancelFunc
	done   chan struct{} // closed when the listening loop has returned
	once   sync.Once
}

// Errors of subscribe.
var (
	errTooManyStreams = errors.New("tasks: too many listen streams")
	errStopped        = errors.New("tasks: notifier stopped")
)

// NewNotifier builds a Notifier for the tasks in db; nothing runs until
// Start.
func NewNotifier(db *pgxpool.Pool, cfg ListenConfig) *Notifier {
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = 10
	}
	if cfg.MaxLifetime <= 0 {
		cfg.MaxLifetime = 30 * time.Minute
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 30 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Notifier{db: db, cfg: cfg, byTask: map[string]map[*subscription]struct{}{}, byPrincipal: map[string]int{},
		ended: make(chan struct{})}
}

// Start connects the listening connection (its own, outside the pool) and
// runs the loop that fans notifications out. It fails if the first
// connection cannot be made; later losses are reconnected, and every
// stream re-reads its tasks once the connection is back.
func (n *Notifier) Start(ctx context.Context) error {
	l := &pglisten.Listener{DB: n.db, Channel: Channel, Name: "arap-tasks-notifier",
		What: "task notifications (streams resync meanwhile)", Log: n.cfg.Log,
		Live: func(live bool) {
			if live { // whatever changed while nobody listened is re-read
				n.wakeAll()
			}
		},
		Heard: n.wake}
	conn, err := l.Dial(ctx)
	if err != nil {
		return err
	}
	loopCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	n.cancel, n.done = cancel, make(chan struct{})
	go func() {
		defer close(n.done)
		l.Run(loopCtx, conn)
	}()
	return nil
}

// Stop ends every open stream (each sends its listen result and closes)
// and closes the listening connection. New streams are refused from then
// on. Stop may be called more than once.
func (n *Notifier) Stop() {
	n.once.Do(func() {
		n.mu.Lock()
		n.stopped = true
		close(n.ended)
		n.mu.Unlock()
		if n.cancel != nil {
			n.cancel()
			<-n.done
		}
	})
}

// wake marks task id changed for every stream subscribed to it.
func (n *Notifier) wake(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for s := range n.byTask[id] {
		s.mark(id)
	}
}

func (n *Notifier) wakeAll() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for id, subs := range n.byTask {
		for s := range subs {
			s.mark(id)
		}
	}
}

// subscribe registers a stream of principal for ids, or refuses it when
// the principal already holds MaxStreams streams here: the count is checked
// and taken under one lock, so concurrent opens cannot overshoot it.
func (n *Notifier) subscribe(principal string, ids []string) (*subscription, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped {
		return nil, errStopped
	}
	if n.byPrincipal[principal] >= n.cfg.MaxStreams {
		return nil, errTooManyStreams
	}
	n.byPrincipal[principal]++
	s := &subscription{n: n, principal: principal, ids: ids, wakeup: make(chan struct{}, 1), dirty: map[string]struct{}{}}
	for _, id := range ids {
		if n.byTask[id] == nil {
			n.byTask[id] = map[*subscription]struct{}{}
		}
		n.byTask[id][s] = struct{}{}
	}
	return s, nil
}

// subscription is one listen stream's registration.
type subscription struct {
	n         *Notifier
	principal string
	ids       []string
	wakeup    chan struct{} // one pending wake-up is enough: dirty says what

	mu    sync.Mutex
	dirty map[string]struct{}
}

func (s *subscription) mark(id string) {
	s.mu.Lock()
	s.dirty[id] = struct{}{}
	s.mu.Unlock()
	select {
	case s.wakeup <- struct{}{}:
	default:
	}
}

// take returns the task ids changed since the last take.
func (s *subscription) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, 0, len(s.dirty))
	for id := range s.dirty {
		ids = append(ids, id)
	}
	clear(s.dirty)
	return ids
}

// close unregisters the stream and frees its place in the principal's cap.
func (s *subscription) close() {
	n := s.n
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, id := range s.ids {
		delete(n.byTask[id], s)
		if len(n.byTask[id]) == 0 {
			delete(n.byTask, id)
		}
	}
	if n.byPrincipal[s.principal]--; n.byPrincipal[s.principal] <= 0 {
		delete(n.byPrincipal, s.principal)
	}
}
