package callbacks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/clients"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/evaluation"
)

// A Target is a named outgoing webhook, such as an ITSM system's, that
// rules name in notify.webhooks. It belongs to an API client: its URL must
// pass that client's callback allow-list (prefixes, and the internal
// networks it may reach), and the client's webhook secrets sign what is
// sent to it, exactly as for the client's callbacks.
type Target struct {
	Name      string    `json:"name"`
	Client    string    `json:"client"` // the client's name
	URL       string    `json:"url"`
	CreatedAt time.Time `json:"created_at"`
}

// ErrNoTarget says no webhook target has that name.
var ErrNoTarget = errors.New("no such webhook target")

// TargetStore manages webhook targets; it needs no master key, since it
// reads no secret (arapctl webhooks).
type TargetStore struct {
	DB *pgxpool.Pool
	// Resolver resolves target hosts; net.DefaultResolver when nil.
	Resolver Resolver
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// NewTargetStore returns a TargetStore on db.
func NewTargetStore(db *pgxpool.Pool) *TargetStore {
	return &TargetStore{DB: db, Resolver: net.DefaultResolver, Now: time.Now}
}

// Create records webhook target name, posting to url for client
// (id or name). It refuses a URL the client's callbacks could not use (the
// same CheckEndpoint, so the same SSRF rules), and a client without a live
// webhook secret, since nothing is ever sent unsigned.
func (s *TargetStore) Create(ctx context.Context, name, client, url, by string) (*Target, error) {
	if !evaluation.WebhookNameRE.MatchString(name) {
		return nil, fmt.Errorf("webhook target name %q must be lower case letters, digits, - and _ (at most 63)", name)
	}
	c, err := clients.NewStore(s.DB).Get(ctx, client)
	if err != nil {
		return nil, err
	}
	if err := CheckEndpoint(ctx, s.Resolver, c, url); err != nil {
		return nil, fmt.Errorf("webhook target %q: %w", name, err)
	}
	var live int
	if err := s.DB.QueryRow(ctx, `SELECT count(*) FROM arap.webhook_secrets WHERE client_id = $1 AND (expires_at IS NULL OR expires_at > $2)`,
		c.ID, s.Now()).Scan(&live); err != nil {
		return nil, err
	}
	if live == 0 {
		return nil, fmt.Errorf("client %q has no webhook secret, and webhooks are never sent unsigned; create one first (arapctl clients secret rotate)", c.Name)
	}
	t := &Target{Name: name, Client: c.Name, URL: url, CreatedAt: s.Now()}
	err = pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO arap.webhook_targets (name, client_id, url, created_at, created_by) VALUES ($1, $2, $3, $4, $5)`,
			name, c.ID, url, t.CreatedAt, by); err != nil {
			if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "23505" {
				return fmt.Errorf("webhook target %q already exists", name)
			}
			return fmt.Errorf("callbacks: store webhook target: %w", err)
		}
		return audit.Append(ctx, tx, audit.Event{Chain: audit.SystemChain, Kind: "webhook_target.created", Actor: by, At: t.CreatedAt,
			Data: map[string]any{"name": name, "client_id": c.ID, "url": url}})
	})
	if err != nil {
		return nil, err
	}
	return t, nil
}

// Delete removes webhook target name; its pending deliveries then fail
// (no such target) and are retried, in case it is created again.
func (s *TargetStore) Delete(ctx context.Context, name, by string) error {
	return pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM arap.webhook_targets WHERE name = $1`, name)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("webhook target %q: %w", name, ErrNoTarget)
		}
		return audit.Append(ctx, tx, audit.Event{Chain: audit.SystemChain, Kind: "webhook_target.deleted", Actor: by, At: s.Now(),
			Data: map[string]any{"name": name}})
	})
}

// List lists the webhook targets by name.
func (s *TargetStore) List(ctx context.Context) ([]Target, error) {
	rows, err := s.DB.Query(ctx, `SELECT t.name, c.name, t.url, t.created_at FROM arap.webhook_targets t
		JOIN arap.api_clients c ON c.id = t.client_id ORDER BY t.name`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Target, error) {
		var t Target
		return t, r.Scan(&t.Name, &t.Client, &t.URL, &t.CreatedAt)
	})
}

// PostTarget POSTs body to webhook target name once, signed with its
// client's live secrets under webhook-id id (stable across retries, so the
// receiver can drop a repeat). The URL is checked again against the
// client's allow-list, which may have narrowed since the target was
// created, and every address dialled is checked as for callbacks (a name
// rebound to an internal address is refused). Anything but a 2xx answer is
// an error, for the caller to retry.
func (s *Service) PostTarget(ctx context.Context, name, id string, body []byte) error {
	var clientID, url string
	err := s.cfg.DB.QueryRow(ctx, `SELECT client_id, url FROM arap.webhook_targets WHERE name = $1`, name).Scan(&clientID, &url)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("webhook target %q: %w", name, ErrNoTarget)
	}
	if err != nil {
		return fmt.Errorf("callbacks: load webhook target %q: %w", name, err)
	}
	c, err := s.clients.Get(ctx, clientID)
	if err != nil {
		return err
	}
	if c.RevokedAt != nil {
		return fmt.Errorf("webhook target %q: client %q is revoked", name, c.Name)
	}
	if err := CheckEndpoint(ctx, s.cfg.Resolver, c, url); err != nil {
		return fmt.Errorf("webhook target %q: %w", name, err)
	}
	keys, err := s.secretKeys(ctx, clientID)
	if err != nil {
		return err
	}
	code, _, err := s.post(ctx, c, keys, id, url, body)
	if err != nil {
		return fmt.Errorf("webhook target %q: %w", name, err)
	}
	if code < 200 || code > 299 {
		return fmt.Errorf("webhook target %q answered %d", name, code)
	}
	return nil
}
