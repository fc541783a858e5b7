// Package attributes owns deployment-wide facts that policy conditions read
// as `attributes.<key>`: a risk level, a change freeze, an incident flag.
// The PDP re-reads them at every evaluation, through a cache that a change
// empties in every replica that listens (Start) and that is at most a second
// old otherwise, so a change takes effect without a policy reload, and
// automated resolvers of pending requests run again when one changes.
package attributes

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"regexp"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/internal/announce"
	"github.com/omcp/arap/internal/pglisten"
)

// maxAge bounds how stale a replica's view of the attributes may be when a
// change's notification is not heard (the listener down, a change written
// in SQL by hand).
const maxAge = time.Second

// Channel is the notification a change sends in its transaction; a
// listening Store empties its cache when it hears one.
const Channel = "arap_attributes"

// Listener is the application_name of a Store's listening connection.
const Listener = "arap-attributes-listener"

// Store reads and writes attributes.
type Store struct {
	db *pgxpool.Pool
	// MaxAge, if set, replaces maxAge (tests that must see a notification
	// work without the cache's expiry).
	MaxAge time.Duration
	// Log, if set, hears that the listener cannot listen.
	Log  *slog.Logger
	load sync.Mutex // one reload at a time
	mu   sync.Mutex
	// gen advances whenever the cache is emptied: a reload that began
	// before a change committed, and ends after its notification was
	// heard, must not keep what it read.
	gen      uint64
	snapshot map[string]any
	loaded   time.Time
	stop     context.CancelFunc
	done     chan struct{}
	// afterRead, if set (tests only), runs between a reload's read and its
	// generation check: where a change can slip in.
	afterRead func()
}

// NewStore returns a Store on db.
func NewStore(db *pgxpool.Pool) *Store { return &Store{db: db} }

var keyRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)

// Snapshot returns every attribute. The map must not be modified.
func (s *Store) Snapshot(ctx context.Context) (map[string]any, error) {
	if snap := s.cached(); snap != nil {
		return snap, nil
	}
	s.load.Lock()
	defer s.load.Unlock()
	if snap := s.cached(); snap != nil { // another caller reloaded it meanwhile
		return snap, nil
	}
	s.mu.Lock()
	gen := s.gen
	s.mu.Unlock()
	// The snapshot's age counts from before the read, so that MaxStaleness
	// bounds how far behind the table it can be.
	start := time.Now()
	rows, err := s.db.Query(ctx, `SELECT key, value FROM arap.attributes`)
	if err != nil {
		return nil, fmt.Errorf("attributes: load: %w", err)
	}
	defer rows.Close()
	snap := map[string]any{}
	for rows.Next() {
		var k string
		var v any
		if err := rows.Scan(&k, &v); err != nil {
			return nil, fmt.Errorf("attributes: load: %w", err)
		}
		snap[k] = v
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if s.afterRead != nil {
		s.afterRead()
	}
	s.mu.Lock()
	if gen == s.gen {
		s.snapshot, s.loaded = snap, start
	}
	s.mu.Unlock()
	return snap, nil
}

// cached is the cache, or nil when it is empty or too old.
func (s *Store) cached() map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.snapshot != nil && time.Since(s.loaded) < cmp.Or(s.MaxAge, maxAge) {
		return s.snapshot
	}
	return nil
}

// MaxStaleness bounds how far behind the table a Snapshot may be: a change
// committed longer ago than this is in every snapshot read after, whether
// or not its notification was heard.
func (s *Store) MaxStaleness() time.Duration { return cmp.Or(s.MaxAge, maxAge) }

// forget empties the cache.
func (s *Store) forget() {
	s.mu.Lock()
	s.snapshot = nil
	s.gen++
	s.mu.Unlock()
}

// Set stores key = value (any JSON value; nil deletes it). then runs in the
// same transaction, for work that must follow the change (re-running
// resolvers).
func (s *Store) Set(ctx context.Context, key string, value any, by string, then func(ctx context.Context, tx pgx.Tx) error) error {
	if !keyRE.MatchString(key) {
		return fmt.Errorf("attributes: key %q must be lower_snake_case", key)
	}
	raw, err := json.Marshal(value)
	if err != nil {
		return fmt.Errorf("attributes: %s: %w", key, err)
	}
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if value == nil {
			if _, err := tx.Exec(ctx, `DELETE FROM arap.attributes WHERE key = $1`, key); err != nil {
				return err
			}
		} else if _, err := tx.Exec(ctx, `INSERT INTO arap.attributes (key, value, updated_at) VALUES ($1, $2, now())
			ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at`, key, raw); err != nil {
			return fmt.Errorf("attributes: set %s: %w", key, err)
		}
		if err := audit.Append(ctx, tx, audit.Event{Chain: audit.SystemChain, Kind: "attribute.set", Actor: by,
			Data: map[string]any{"key": key, "value": json.RawMessage(raw)}}); err != nil {
			return err
		}
		// Heard by every listening replica if, and once, this commits;
		// and by the front-ends' decision caches, through every replica.
		if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, Channel, key); err != nil {
			return fmt.Errorf("attributes: announce %s: %w", key, err)
		}
		if err := announce.In(ctx, tx, announce.Attributes, ""); err != nil {
			return fmt.Errorf("attributes: %s: %w", key, err)
		}
		if then != nil {
			return then(ctx, tx)
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.forget()
	return nil
}

// Start listens on Channel until Stop, emptying the cache at every change
// another process (arapctl, another replica) makes, and once the LISTEN
// holds after a loss; meanwhile the cache keeps its one-second bound (a
// host.Service).
func (s *Store) Start(context.Context) error {
	ctx, stop := context.WithCancel(context.Background())
	s.stop, s.done = stop, make(chan struct{})
	l := pglisten.Listener{DB: s.db, Channel: Channel, Name: Listener,
		What: "attribute changes (each replica's view up to a second old meanwhile)", Log: s.Log,
		Live: func(bool) { s.forget() }, Heard: func(string) { s.forget() }}
	go func() {
		defer close(s.done)
		l.Run(ctx, nil)
	}()
	return nil
}

// Stop ends the listener.
func (s *Store) Stop() {
	if s.stop != nil {
		s.stop()
		<-s.done
	}
}
