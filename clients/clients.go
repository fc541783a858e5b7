// Package clients owns the API clients of the backend: PEPs, automated
// resolvers, supervising agents and ITSM systems. Each holds a bearer token,
// stored only as its SHA-256 (tokens are 256-bit random values, so a fast hash
// is enough and lookups stay cheap), scopes that say which endpoints it may
// call, and a resolver kind that says what sort of decider it is.
package clients

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/internal/announce"
)

// Scopes.
const (
	ScopeEvaluate = "evaluate" // AuthZEN evaluation endpoints
	ScopeRequest  = "request"  // submit, read and cancel its own access requests
	ScopeDecide   = "decide"   // decision API
	ScopeAdmin    = "admin"    // operator endpoints
	ScopeAudit    = "audit"    // read the audit trail (GET /v1/audit)
	// ScopeDecideForPeople lets a client that may use the decision API
	// record a decision as a named directory user (on_behalf_of), as an
	// ITSM approval or a chat bot would; the person's eligibility applies.
	ScopeDecideForPeople = "decide_for_people"
)

// AllScopes lists every scope.
var AllScopes = []string{ScopeEvaluate, ScopeRequest, ScopeDecide, ScopeAdmin, ScopeDecideForPeople, ScopeAudit}

// Resolver kinds.
const (
	KindHuman      = "human"
	KindAutomation = "automation"
	KindAgent      = "agent"
	KindITSM       = "itsm"
)

// AllKinds lists every resolver kind.
var AllKinds = []string{KindHuman, KindAutomation, KindAgent, KindITSM}

// Client is an API client.
type Client struct {
	ID     string   `json:"id"`
	Name   string   `json:"name"`
	Scopes []string `json:"scopes"`
	Kind   string   `json:"resolver_kind"`
	Actors []string `json:"actors"`
	// CallbackPrefixes are the URL prefixes the client may register as
	// callback endpoints; CallbackNetworks the internal address kinds
	// (loopback, private, link-local) those endpoints may resolve to.
	CallbackPrefixes []string   `json:"callback_prefixes"`
	CallbackNetworks []string   `json:"callback_networks"`
	CreatedAt        time.Time  `json:"created_at"`
	RevokedAt        *time.Time `json:"revoked_at,omitempty"`
}

// Networks a callback may be allowed to reach besides the public internet.
const (
	NetworkLoopback  = "loopback"
	NetworkPrivate   = "private"
	NetworkLinkLocal = "link-local"
)

// AllNetworks lists them.
var AllNetworks = []string{NetworkLoopback, NetworkPrivate, NetworkLinkLocal}

// Has reports whether the client holds scope.
func (c *Client) Has(scope string) bool { return slices.Contains(c.Scopes, scope) }

// MayAssertActor reports whether the client may claim to act through actor id
// (an entry of client.actor or subject.properties.act). Patterns use path.Match
// syntax, so "agent:*" allows every agent.
func (c *Client) MayAssertActor(id string) bool {
	for _, p := range c.Actors {
		if ok, _ := path.Match(p, id); ok {
			return true
		}
	}
	return false
}

// Principal is the audit name of the client.
func (c *Client) Principal() string { return "client:" + c.Name }

// Errors.
var (
	ErrUnauthenticated = errors.New("clients: unknown or revoked token")
	ErrNotFound        = errors.New("clients: no such client")
	ErrNameTaken       = errors.New("clients: name already in use")
)

// CacheTTL bounds how long a revoked token may still be accepted by a
// replica that authenticated it just before.
const CacheTTL = 5 * time.Second

// Store reads and writes clients.
type Store struct {
	db    *pgxpool.Pool
	mu    sync.Mutex
	cache map[[32]byte]cached
}

type cached struct {
	c   *Client
	exp time.Time
}

// NewStore returns a Store on db.
func NewStore(db *pgxpool.Pool) *Store {
	return &Store{db: db, cache: map[[32]byte]cached{}}
}

// New describes a client to create.
type New struct {
	Name   string
	Scopes []string
	Kind   string
	Actors []string
	// CallbackPrefixes and CallbackNetworks allow callbacks (see Client).
	CallbackPrefixes []string
	CallbackNetworks []string
	// Token, when set, is used instead of a generated one (dev mode's fixed
	// tokens). It must be at least 12 characters.
	Token string
}

// Create adds a client and returns it with its token, which is shown once and
// never stored.
func (s *Store) Create(ctx context.Context, n New, by string) (*Client, string, error) {
	if err := validate(n); err != nil {
		return nil, "", err
	}
	token := n.Token
	if token == "" {
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return nil, "", err
		}
		token = "arap_" + base64.RawURLEncoding.EncodeToString(b)
	}
	hash := sha256.Sum256([]byte(token))
	c := &Client{ID: newID(), Name: n.Name, Scopes: n.Scopes, Kind: n.Kind, Actors: n.Actors,
		CallbackPrefixes: n.CallbackPrefixes, CallbackNetworks: n.CallbackNetworks, CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
	for _, l := range []*[]string{&c.Actors, &c.CallbackPrefixes, &c.CallbackNetworks} {
		if *l == nil {
			*l = []string{}
		}
	}
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO arap.api_clients (id, name, token_hash, scopes, resolver_kind, actors,
			callback_prefixes, callback_networks, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
			c.ID, c.Name, hash[:], c.Scopes, c.Kind, c.Actors, c.CallbackPrefixes, c.CallbackNetworks, c.CreatedAt)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" {
			return ErrNameTaken
		}
		if err != nil {
			return fmt.Errorf("clients: insert: %w", err)
		}
		return audit.Append(ctx, tx, audit.Event{Chain: audit.SystemChain, Kind: "client.created", Actor: by, At: c.CreatedAt,
			Data: map[string]any{"client_id": c.ID, "name": c.Name, "scopes": c.Scopes, "resolver_kind": c.Kind, "actors": c.Actors,
				"callback_prefixes": c.CallbackPrefixes, "callback_networks": c.CallbackNetworks}})
	})
	if err != nil {
		return nil, "", err
	}
	return c, token, nil
}

func validate(n New) error {
	if n.Name == "" || len(n.Name) > 100 || strings.ContainsAny(n.Name, " \t\n") {
		return fmt.Errorf("clients: name must be 1-100 characters without spaces")
	}
	if len(n.Scopes) == 0 {
		return fmt.Errorf("clients: at least one scope is required (%s)", strings.Join(AllScopes, ", "))
	}
	for _, sc := range n.Scopes {
		if !slices.Contains(AllScopes, sc) {
			return fmt.Errorf("clients: unknown scope %q (known: %s)", sc, strings.Join(AllScopes, ", "))
		}
	}
	if !slices.Contains(AllKinds, n.Kind) {
		return fmt.Errorf("clients: unknown resolver kind %q (known: %s)", n.Kind, strings.Join(AllKinds, ", "))
	}
	for _, a := range n.Actors {
		if _, err := path.Match(a, ""); err != nil {
			return fmt.Errorf("clients: bad actor pattern %q: %w", a, err)
		}
	}
	for _, p := range n.CallbackPrefixes {
		if p == "https://" {
			continue // any https endpoint (still subject to the network checks)
		}
		u, err := url.Parse(p)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil {
			return fmt.Errorf("clients: callback prefix %q must be an absolute http(s) URL without credentials, or https:// for any https endpoint", p)
		}
	}
	for _, nw := range n.CallbackNetworks {
		if !slices.Contains(AllNetworks, nw) {
			return fmt.Errorf("clients: unknown callback network %q (known: %s)", nw, strings.Join(AllNetworks, ", "))
		}
	}
	if n.Token != "" && len(n.Token) < 12 {
		return errors.New("clients: a fixed token must be at least 12 characters")
	}
	return nil
}

func newID() string { return "cli_" + strings.ToLower(rand.Text()) }

const clientColumns = `id, name, token_hash, scopes, resolver_kind, actors, callback_prefixes, callback_networks, created_at, revoked_at`

const selectClient = `SELECT ` + clientColumns + ` FROM arap.api_clients`

func scanClient(row pgx.Row) (*Client, []byte, error) {
	var c Client
	var hash []byte
	err := row.Scan(&c.ID, &c.Name, &hash, &c.Scopes, &c.Kind, &c.Actors, &c.CallbackPrefixes, &c.CallbackNetworks, &c.CreatedAt, &c.RevokedAt)
	return &c, hash, err
}

// Authenticate returns the live client holding token.
func (s *Store) Authenticate(ctx context.Context, token string) (*Client, error) {
	if token == "" {
		return nil, ErrUnauthenticated
	}
	hash := sha256.Sum256([]byte(token))
	now := time.Now()
	s.mu.Lock()
	if e, ok := s.cache[hash]; ok && now.Before(e.exp) {
		s.mu.Unlock()
		return e.c, nil
	}
	s.mu.Unlock()
	c, stored, err := scanClient(s.db.QueryRow(ctx, selectClient+` WHERE token_hash = $1`, hash[:]))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrUnauthenticated
	}
	if err != nil {
		return nil, fmt.Errorf("clients: authenticate: %w", err)
	}
	if subtle.ConstantTimeCompare(stored, hash[:]) != 1 || c.RevokedAt != nil {
		return nil, ErrUnauthenticated
	}
	s.mu.Lock()
	if len(s.cache) > 10000 {
		clear(s.cache)
	}
	s.cache[hash] = cached{c: c, exp: now.Add(CacheTTL)}
	s.mu.Unlock()
	return c, nil
}

// Get returns a client by id or name.
func (s *Store) Get(ctx context.Context, idOrName string) (*Client, error) {
	c, _, err := scanClient(s.db.QueryRow(ctx, selectClient+` WHERE id = $1 OR name = $1`, idOrName))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("clients: get: %w", err)
	}
	return c, nil
}

// NameOf returns the name of the client with id (ids only: a name that
// looks like an id names nothing here).
func (s *Store) NameOf(ctx context.Context, id string) (string, error) {
	var name string
	err := s.db.QueryRow(ctx, `SELECT name FROM arap.api_clients WHERE id = $1`, id).Scan(&name)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("clients: name: %w", err)
	}
	return name, nil
}

// List returns every client, oldest first.
func (s *Store) List(ctx context.Context) ([]*Client, error) {
	rows, err := s.db.Query(ctx, selectClient+` ORDER BY created_at, name`)
	if err != nil {
		return nil, fmt.Errorf("clients: list: %w", err)
	}
	defer rows.Close()
	var out []*Client
	for rows.Next() {
		c, _, err := scanClient(rows)
		if err != nil {
			return nil, fmt.Errorf("clients: list: %w", err)
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// Revoke disables a client's token. Revoking twice is not an error.
func (s *Store) Revoke(ctx context.Context, idOrName, by string) (*Client, error) {
	var c *Client
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var err error
		c, _, err = scanClient(tx.QueryRow(ctx, `UPDATE arap.api_clients SET revoked_at = coalesce(revoked_at, now())
			WHERE id = $1 OR name = $1 RETURNING `+clientColumns, idOrName))
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return fmt.Errorf("clients: revoke: %w", err)
		}
		// A front-end whose own client this is stops using the decisions
		// it remembered (package announce) when this commits.
		if err := announce.In(ctx, tx, announce.Client, c.ID); err != nil {
			return fmt.Errorf("clients: revoke: %w", err)
		}
		return audit.Append(ctx, tx, audit.Event{Chain: audit.SystemChain, Kind: "client.revoked", Actor: by,
			Data: map[string]any{"client_id": c.ID, "name": c.Name}})
	})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	clear(s.cache)
	s.mu.Unlock()
	return c, nil
}
