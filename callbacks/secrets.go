package callbacks

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/internal/seal"
	"github.com/omcp/arap/webhook"
)

// RotateSecret gives client clientID a new webhook secret and returns it
// (shown once). Earlier secrets keep signing until overlap has passed, so a
// receiver can switch without missing a callback; overlap 0 ends them now.
// fixed, when set, is used as the new secret (dev mode's pinned one).
func (s *Service) RotateSecret(ctx context.Context, clientID string, overlap time.Duration, fixed, by string) (string, error) {
	secret := fixed
	if secret == "" {
		secret = webhook.NewSecret()
	}
	if _, err := webhook.ParseSecret(secret); err != nil {
		return "", err
	}
	id := "whs_" + rand.Text()
	err := pgx.BeginFunc(ctx, s.cfg.DB, func(tx pgx.Tx) error {
		now := s.cfg.Now()
		if _, err := tx.Exec(ctx, `UPDATE arap.webhook_secrets SET expires_at = $2 WHERE client_id = $1 AND (expires_at IS NULL OR expires_at > $2)`,
			clientID, now.Add(overlap)); err != nil {
			return fmt.Errorf("callbacks: retire secrets: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO arap.webhook_secrets (id, client_id, sealed, created_at) VALUES ($1, $2, $3, $4)`,
			id, clientID, s.box.Seal([]byte(secret), id), now); err != nil {
			return fmt.Errorf("callbacks: store secret: %w", err)
		}
		return audit.Append(ctx, tx, audit.Event{Chain: audit.SystemChain, Kind: "webhook_secret.rotated", Actor: by, At: now,
			Data: map[string]any{"client_id": clientID, "secret_id": id, "previous_valid_until": now.Add(overlap)}})
	})
	if err != nil {
		return "", err
	}
	return secret, nil
}

// HasSecret reports whether the client has a live webhook secret.
func (s *Service) HasSecret(ctx context.Context, clientID string) (bool, error) {
	keys, err := s.secretKeys(ctx, clientID)
	return len(keys) > 0, err
}

// secretKeys returns the key bytes of the client's live secrets, newest first.
func (s *Service) secretKeys(ctx context.Context, clientID string) ([][]byte, error) {
	rows, err := s.cfg.DB.Query(ctx, `SELECT id, sealed FROM arap.webhook_secrets WHERE client_id = $1 AND (expires_at IS NULL OR expires_at > $2)
		ORDER BY created_at DESC`, clientID, s.cfg.Now())
	if err != nil {
		return nil, fmt.Errorf("callbacks: load secrets: %w", err)
	}
	defer rows.Close()
	var keys [][]byte
	for rows.Next() {
		var id string
		var sealed []byte
		if err := rows.Scan(&id, &sealed); err != nil {
			return nil, err
		}
		plain, err := s.box.Open(sealed, id)
		if err != nil {
			return nil, fmt.Errorf("callbacks: secret %s: %w", id, err)
		}
		key, err := webhook.ParseSecret(string(plain))
		if err != nil {
			return nil, err
		}
		keys = append(keys, key)
	}
	return keys, rows.Err()
}

// Sealed lists the columns this package seals under the master key, for a
// re-seal after a master-key rotation (internal/seal.Reseal).
var Sealed = []seal.Column{{Schema: "arap", Table: "webhook_secrets", Key: "id", Value: "sealed", AD: "id"}}
