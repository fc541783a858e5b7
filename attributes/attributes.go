// Package attributes owns deployment-wide facts that policy conditions read
// as `attributes.<key>`: a risk level, a change freeze, an incident flag.
// The PDP re-reads them at every evaluation (through a cache at most a second
// old), so a change takes effect without a policy reload, and automated
// resolvers of pending requests run again when one changes.
package attributes

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/audit"
)

// maxAge bounds how stale a replica's view of the attributes may be.
const maxAge = time.Second

// Store reads and writes attributes.
type Store struct {
	db       *pgxpool.Pool
	mu       sync.Mutex
	snapshot map[string]any
	loaded   time.Time
}

// NewStore returns a Store on db.
func NewStore(db *pgxpool.Pool) *Store { return &Store{db: db} }

var keyRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)

// Snapshot returns every attribute. The map must not be modified.
func (s *Store) Snapshot(ctx context.Context) (map[string]any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.snapshot != nil && time.Since(s.loaded) < maxAge {
		return s.snapshot, nil
	}
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
	s.snapshot, s.loaded = snap, time.Now()
	return snap, nil
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
		if then != nil {
			return then(ctx, tx)
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.snapshot = nil
	s.mu.Unlock()
	return nil
}
