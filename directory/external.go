package directory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/omcp/arap/audit"
)

// External is who an OpenID provider says signed in, from claims it signed.
// The pair (Issuer, Subject) is the identity; the rest is what the provider
// says about that person today.
type External struct {
	Issuer  string
	Subject string
	// PreferredName is a wish for the user name of a new user
	// (preferred_username, or the local part of a verified e-mail address);
	// it is normalised and made unique, and never selects an existing user.
	PreferredName string
	DisplayName   string
	// Email is stored only when the provider says it verified it; an
	// unverified address is nobody's proven address and replaces whatever
	// was stored with nothing.
	Email         string
	EmailVerified bool
	// SyncGroups makes Groups the user's complete group membership: values
	// naming a directory group become memberships, memberships not named
	// are removed, values naming no group are ignored.
	SyncGroups bool
	Groups     []string
}

// ErrBadExternal is an External without issuer or subject.
var ErrBadExternal = errors.New("directory: an external identity needs an issuer and a subject")

// SignInExternal returns the user linked to e's (issuer, subject), creating
// one on first sign-in, and brings its display name, e-mail address and
// (with SyncGroups) groups up to date with e. Every change is an audit event
// in the system chain, by "oidc:<issuer>". A disabled user gets
// ErrUserDisabled and nothing changes.
func (s *Store) SignInExternal(ctx context.Context, e External) (*User, error) {
	if e.Issuer == "" || e.Subject == "" {
		return nil, ErrBadExternal
	}
	var name string
	var err error
	// Two first sign-ins of one identity race to insert the link; the loser
	// finds it on its retry.
	for range 3 {
		err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
			name, err = s.signInExternal(ctx, tx, e)
			return err
		})
		if !isUnique(err) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	return s.User(ctx, name)
}

func (s *Store) signInExternal(ctx context.Context, tx pgx.Tx, e External) (string, error) {
	by := "oidc:" + e.Issuer
	email := ""
	if e.EmailVerified {
		email = strings.ToLower(strings.TrimSpace(e.Email))
	}
	display := strings.TrimSpace(e.DisplayName)
	var name string
	err := tx.QueryRow(ctx, `SELECT user_name FROM arap.user_identities WHERE issuer = $1 AND subject = $2 FOR UPDATE`,
		e.Issuer, e.Subject).Scan(&name)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if name, err = createExternal(ctx, tx, e, display, email, by); err != nil {
			return "", err
		}
	case err != nil:
		return "", fmt.Errorf("directory: external identity: %w", err)
	default:
		var oldDisplay, oldEmail string
		var disabled bool
		if err := tx.QueryRow(ctx, `SELECT display_name, coalesce(email, ''), disabled_at IS NOT NULL FROM arap.users WHERE name = $1 FOR UPDATE`,
			name).Scan(&oldDisplay, &oldEmail, &disabled); err != nil {
			return "", fmt.Errorf("directory: user %s: %w", name, err)
		}
		if disabled {
			return "", ErrUserDisabled
		}
		if display == "" {
			display = oldDisplay
		}
		if display != oldDisplay || email != oldEmail {
			if _, err := tx.Exec(ctx, `UPDATE arap.users SET display_name = $2, email = nullif($3, '') WHERE name = $1`, name, display, email); err != nil {
				return "", fmt.Errorf("directory: update user %s: %w", name, err)
			}
			if err := changed(ctx, tx, audit.Event{Chain: audit.SystemChain, Kind: "user.updated", Actor: by,
				Data: map[string]any{"user": name, "display_name": display, "email": email}}); err != nil {
				return "", err
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE arap.user_identities SET last_sign_in_at = now() WHERE issuer = $1 AND subject = $2`, e.Issuer, e.Subject); err != nil {
			return "", err
		}
	}
	if e.SyncGroups {
		if err := syncGroups(ctx, tx, name, e.Groups, by); err != nil {
			return "", err
		}
	}
	return name, nil
}

// createExternal creates the user of a first sign-in under a free name and
// links the identity to it.
func createExternal(ctx context.Context, tx pgx.Tx, e External, display, email, by string) (string, error) {
	base := NormalName(e.PreferredName)
	if display == "" {
		display = base
	}
	for i := 1; i <= 1000; i++ {
		name := base
		if i > 1 {
			suffix := strconv.Itoa(i)
			name = base[:min(len(base), 63-len(suffix))] + suffix
		}
		// ON CONFLICT: a name already taken, by a local account or another
		// provider's user, is never reused; the next suffix is tried.
		tag, err := tx.Exec(ctx, `INSERT INTO arap.users (name, display_name, email, created_at) VALUES ($1, $2, nullif($3, ''), now())
			ON CONFLICT (name) DO NOTHING`, name, display, email)
		if err != nil {
			return "", fmt.Errorf("directory: create user: %w", err)
		}
		if tag.RowsAffected() == 0 {
			continue
		}
		if _, err := tx.Exec(ctx, `INSERT INTO arap.user_identities (issuer, subject, user_name, created_at, last_sign_in_at) VALUES ($1, $2, $3, now(), now())`,
			e.Issuer, e.Subject, name); err != nil {
			return "", err // a unique violation: another sign-in linked it first; the caller retries
		}
		return name, changed(ctx, tx, audit.Event{Chain: audit.SystemChain, Kind: "user.created", Actor: by,
			Data: map[string]any{"user": name, "email": email, "issuer": e.Issuer, "subject": e.Subject}})
	}
	return "", fmt.Errorf("directory: no free user name for %q", base)
}

// syncGroups makes want (restricted to existing groups) the user's groups.
func syncGroups(ctx context.Context, tx pgx.Tx, user string, want []string, by string) error {
	var have, exist []string
	if err := tx.QueryRow(ctx, `SELECT coalesce(array_agg(group_name ORDER BY group_name), '{}') FROM arap.group_members WHERE user_name = $1`, user).Scan(&have); err != nil {
		return err
	}
	if err := tx.QueryRow(ctx, `SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM arap.groups WHERE name = ANY($1)`, want).Scan(&exist); err != nil {
		return err
	}
	for _, g := range exist {
		if slices.Contains(have, g) {
			continue
		}
		if _, err := tx.Exec(ctx, `INSERT INTO arap.group_members (group_name, user_name) VALUES ($1, $2)`, g, user); err != nil {
			return err
		}
		if err := changed(ctx, tx, audit.Event{Chain: audit.SystemChain, Kind: "group.member_added", Actor: by,
			Data: map[string]any{"group": g, "user": user}}); err != nil {
			return err
		}
	}
	for _, g := range have {
		if slices.Contains(exist, g) {
			continue
		}
		if _, err := tx.Exec(ctx, `DELETE FROM arap.group_members WHERE group_name = $1 AND user_name = $2`, g, user); err != nil {
			return err
		}
		if err := changed(ctx, tx, audit.Event{Chain: audit.SystemChain, Kind: "group.member_removed", Actor: by,
			Data: map[string]any{"group": g, "user": user}}); err != nil {
			return err
		}
	}
	return nil
}

// NormalName turns a provider's preferred user name into one ValidName
// accepts: lower case, the part before any '@', other characters outside
// [a-z0-9._-] replaced by '-', starting with a letter, at most 56 bytes (so
// a numeric suffix fits); "user" if nothing is left.
func NormalName(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	if i := strings.IndexByte(s, '@'); i >= 0 {
		s = s[:i]
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	s = strings.TrimLeft(b.String(), "0123456789._-")
	s = s[:min(len(s), 56)]
	if s == "" || !ValidName(s) {
		return "user"
	}
	return s
}
