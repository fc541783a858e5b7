package pep

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/identity"
)

// Principal is an authenticated MCP caller: the subject it acts for and the
// actor (agent) acting. Tasks are bound to it; approvals are for it. In Go
// it is always a Principal; wherever it is stored or compared it is its Key
// (the task store's and the approval tasks' principal columns, the
// requestState, the audit trail, callerKey in SQL), which is all mcp/tasks
// knows of it: an opaque owner. The one exception is data already on disk:
// the sealed call binding holds the struct as encoding/json writes it, and
// binding checks its Key against the task's.
type Principal struct {
	Name        string // caller name
	SubjectType string
	SubjectID   string
	ActorID     string
	// Prior are the actors of a longer delegation chain (an OAuth token's
	// nested act claim), after ActorID: the one ActorID acts for first.
	Prior []string
	// Issuer is the authorization server that issued the caller's OAuth
	// access token ("" for a caller token arap issued); ClientID is the
	// client it was issued to.
	Issuer, ClientID string
	// anonymous marks the principal of a request without credentials
	// (conformance fixture mode): it may call fixtures, never the gate.
	anonymous bool
}

// Key identifies the principal for task ownership: the same subject through
// the same actor chain owns the same tasks, whichever of its tokens is
// used. An OAuth principal's is namespaced by its issuer (oauthPrefix):
// two issuers' "alice" are two people, and neither is arap's.
func (p Principal) Key() string {
	k := p.SubjectType + ":" + p.SubjectID + "|" + p.ActorID
	for _, a := range p.Prior {
		k += ">" + a
	}
	if p.Issuer != "" {
		k = oauthPrefix + p.Issuer + "|" + k
	}
	return k
}

// oauthPrefix starts the key of a principal authenticated by an OAuth
// access token; no caller token's key starts with it (a subject type holds
// no "|").
const oauthPrefix = "oauth|"

// Subject is the AuthZEN subject for this principal, the actor chain in
// properties.act (the OAuth actor-profile convention: the acting actor
// outermost); an OAuth principal's issuer and client are properties too, for
// policy.
func (p Principal) Subject() authzen.Object {
	s := authzen.Object{"type": p.SubjectType, "id": p.SubjectID}
	props := map[string]any{}
	if p.ActorID != "" {
		var act map[string]any
		for i := len(p.Prior) - 1; i >= 0; i-- {
			link := map[string]any{"sub": p.Prior[i]}
			if act != nil {
				link["act"] = act
			}
			act = link
		}
		link := map[string]any{"sub": p.ActorID}
		if act != nil {
			link["act"] = act
		}
		props["act"] = link
	}
	if p.Issuer != "" {
		props["iss"] = p.Issuer
		if p.ClientID != "" {
			props["client_id"] = p.ClientID
		}
	}
	if len(props) > 0 {
		s["properties"] = props
	}
	return s
}

// Callers maps MCP bearer tokens to principals (pep.callers). Tokens are
// stored as SHA-256 hashes.
//
// The gate's Callers remember the principals they authenticated, so a
// caller's requests need not read the table each time, but only while
// Listen hears every revocation: Revoke announces it on CallersChannel in
// its transaction, and every replica's listener drops what it remembered
// when it commits. A replica that is not listening (not started, or its
// listening connection lost) remembers nothing and reads the table on
// every request. A Callers made as a literal (arapctl) never remembers.
type Callers struct {
	DB    *pgxpool.Pool
	cache *callerCache // nil: no memory
	// revoked, if set, also hears every revocation (the gate's decision
	// memory empties too).
	revoked func()
}

// heard is a revocation heard or made here.
func (c *Callers) heard() {
	c.cache.forget()
	if c.revoked != nil {
		c.revoked()
	}
}

// CallersChannel is the PostgreSQL notification channel on which Revoke
// announces a revocation, in its transaction.
const CallersChannel = "pep_callers"

// ErrUnknownCaller means the token is unknown or revoked.
var ErrUnknownCaller = errors.New("pep: unknown or revoked token")

// Create registers a caller token.
func (c *Callers) Create(ctx context.Context, name, token string, p Principal) error {
	if len(token) < 12 || name == "" || p.SubjectID == "" {
		return errors.New("pep: a caller needs a name, a subject and a token of at least 12 characters")
	}
	if p.SubjectType == "" {
		p.SubjectType = "user"
	}
	if strings.Contains(p.SubjectType, "|") {
		return fmt.Errorf("pep: the caller's subject type %q holds a |", p.SubjectType) // keys of OAuth principals start oauth|
	}
	// The backend refuses non-canonical identities at evaluation; a caller
	// made with one could never get a decision, so refuse it here, by name.
	for what, id := range map[string]string{"subject type": p.SubjectType, "subject": p.SubjectID, "actor": p.ActorID} {
		if id == "" && what == "actor" {
			continue
		}
		if err := identity.Check(id); err != nil {
			return fmt.Errorf("pep: the caller's %s %q %v", what, id, err)
		}
	}
	h := sha256.Sum256([]byte(token))
	_, err := c.DB.Exec(ctx, `INSERT INTO pep.callers (token_hash, name, subject_type, subject_id, actor_id, created_at) VALUES ($1, $2, $3, $4, $5, now())`,
		h[:], name, p.SubjectType, p.SubjectID, p.ActorID)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return fmt.Errorf("pep: caller %q exists", name)
	}
	return err
}

// Authenticate returns the principal of a live token.
func (c *Callers) Authenticate(ctx context.Context, token string) (Principal, error) {
	h := sha256.Sum256([]byte(token))
	p, st, ok := c.cache.get(h)
	if ok {
		return p, nil
	}
	var revoked *time.Time
	err := c.DB.QueryRow(ctx, `SELECT name, subject_type, subject_id, actor_id, revoked_at FROM pep.callers WHERE token_hash = $1`, h[:]).
		Scan(&p.Name, &p.SubjectType, &p.SubjectID, &p.ActorID, &revoked)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && revoked != nil) {
		return Principal{}, ErrUnknownCaller
	}
	if err != nil {
		return Principal{}, err
	}
	c.cache.put(h, p, st, callerCacheTTL)
	return p, nil
}

// callerKey is Principal.Key over a pep.callers row c, for SQL.
const callerKey = `c.subject_type || ':' || c.subject_id || '|' || c.actor_id`

// callerLive is, in SQL, "the principal whose Key is in column col still
// has a live token": the execution claim checks it in its own statement.
// FOR SHARE serializes it with a revocation (Revoke's UPDATE): a claim
// waits for a revocation in flight and then sees it, and a revocation
// waits for a claim in flight, so a revoker is never answered before a
// claim that commits after.
//
// An OAuth principal has no row: its access token's lifetime is its own,
// checked when it was presented, and nothing revokes it here.
func callerLive(col string) string {
	return `(starts_with(` + col + `, '` + oauthPrefix + `') OR EXISTS (SELECT 1 FROM pep.callers c WHERE c.revoked_at IS NULL AND ` + callerKey + ` = ` + col + ` FOR SHARE))`
}

// Valid reports whether the principal still has a live token: an approval
// never outlives the caller it was for. The execution claim makes the same
// check in its own statement (execute).
func (c *Callers) Valid(ctx context.Context, p Principal) (bool, error) {
	if p.Issuer != "" {
		return true, nil // an OAuth principal: see callerLive
	}
	var ok bool
	err := c.DB.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pep.callers c WHERE c.revoked_at IS NULL AND `+callerKey+` = $1)`, p.Key()).Scan(&ok)
	return ok, err
}

// Revoke disables a caller. Every replica listening (Listen) forgets the
// principals it remembered when the revocation commits; this one at once.
func (c *Callers) Revoke(ctx context.Context, name string) error {
	err := pgx.BeginFunc(ctx, c.DB, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE pep.callers SET revoked_at = coalesce(revoked_at, now()) WHERE name = $1`, name)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("pep: no caller %q", name)
		}
		// Delivered when the transaction commits, not before.
		_, err = tx.Exec(ctx, `SELECT pg_notify($1, '')`, CallersChannel)
		return err
	})
	c.heard()
	return err
}
