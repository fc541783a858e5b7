package pep

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// RateCounters is the front-end's table of rate-limit counters
// (internal/ratelimit).
var RateCounters = pgx.Identifier{"pep", "rate_counters"}

// WebhookIDs is the callback verifier's replay memory in pep.webhook_ids,
// shared by every replica of the front-end and kept across restarts
// (a webhook.ReplayStore).
type WebhookIDs struct {
	DB interface {
		QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
		Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	}
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

func (s *WebhookIDs) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// Claim records id until the given time, in one statement: the insert wins,
// or an expired claim is taken over; a live claim, even one another replica
// took a moment ago, leaves no row to return.
func (s *WebhookIDs) Claim(ctx context.Context, id string, until time.Time) (bool, error) {
	var ok bool
	err := s.DB.QueryRow(ctx, `INSERT INTO pep.webhook_ids AS w (id, expires_at) VALUES ($1, $2)
		ON CONFLICT (id) DO UPDATE SET expires_at = EXCLUDED.expires_at, handled = false WHERE w.expires_at <= $3
		RETURNING true`, id, until, s.now()).Scan(&ok)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("pep: claim webhook id: %w", err)
	}
	return ok, nil
}

// Release forgets the claim of id.
func (s *WebhookIDs) Release(ctx context.Context, id string) error {
	if _, err := s.DB.Exec(ctx, `DELETE FROM pep.webhook_ids WHERE id = $1`, id); err != nil {
		return fmt.Errorf("pep: release webhook id: %w", err)
	}
	return nil
}

// Done marks the claim of id as handled.
func (s *WebhookIDs) Done(ctx context.Context, id string) error {
	if _, err := s.DB.Exec(ctx, `UPDATE pep.webhook_ids SET handled = true WHERE id = $1`, id); err != nil {
		return fmt.Errorf("pep: mark webhook id handled: %w", err)
	}
	return nil
}

// Handled reports whether a live claim of id is marked handled.
func (s *WebhookIDs) Handled(ctx context.Context, id string) (bool, error) {
	var done bool
	err := s.DB.QueryRow(ctx, `SELECT handled FROM pep.webhook_ids WHERE id = $1 AND expires_at > $2`, id, s.now()).Scan(&done)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("pep: read webhook id: %w", err)
	}
	return done, nil
}

// Purge deletes expired claims.
func (s *WebhookIDs) Purge(ctx context.Context) (int64, error) {
	tag, err := s.DB.Exec(ctx, `DELETE FROM pep.webhook_ids WHERE expires_at <= $1`, s.now())
	if err != nil {
		return 0, fmt.Errorf("pep: purge webhook ids: %w", err)
	}
	return tag.RowsAffected(), nil
}
