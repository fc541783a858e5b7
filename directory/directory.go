// Package directory owns the people of a deployment: users (approvers and
// requesters), their groups, and their passwords for the approver web UI.
// Approver policies name groups and users; eligibility checks ask the
// directory who someone is and which groups they are in.
package directory

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/crypto/bcrypt"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/identity"
	"github.com/omcp/arap/internal/announce"
)

// User is a person.
type User struct {
	Name        string     `json:"name"`
	DisplayName string     `json:"display_name"`
	Email       string     `json:"email,omitempty"`
	Groups      []string   `json:"groups"`
	CreatedAt   time.Time  `json:"created_at"`
	DisabledAt  *time.Time `json:"disabled_at,omitempty"`
}

// Identities are who this user is: name and e-mail address, both in
// case-insensitive id spaces. Eligibility compares them with a request's
// subject and actor chain.
func (u *User) Identities() []identity.ID {
	ids := []identity.ID{identity.Name(u.Name)}
	if u.Email != "" {
		ids = append(ids, identity.Name(u.Email))
	}
	return ids
}

// Errors.
var (
	ErrNotFound     = errors.New("directory: no such user or group")
	ErrAmbiguous    = errors.New("directory: ambiguous user")
	ErrExists       = errors.New("directory: already exists")
	ErrBadPassword  = errors.New("directory: wrong user name or password")
	ErrUserDisabled = errors.New("directory: user is disabled")
)

// Store reads and writes the directory.
type Store struct {
	db     *pgxpool.Pool
	checks atomic.Uint64
}

// NewStore returns a Store on db.
func NewStore(db *pgxpool.Pool) *Store { return &Store{db: db} }

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9._-]{0,62}$`)

// ValidName reports whether name has the form of a user name (so a name
// that does not can be refused before it reaches the database).
func ValidName(name string) bool { return nameRE.MatchString(name) }

// PasswordChecks is how many passwords this store has compared against a
// hash (each one a bcrypt computation, whatever the outcome).
func (s *Store) PasswordChecks() uint64 { return s.checks.Load() }

// MinPasswordLen is the shortest password accepted.
const MinPasswordLen = 8

// CreateUser adds a user. password may be empty (no web sign-in).
func (s *Store) CreateUser(ctx context.Context, u User, password, by string) error {
	if !nameRE.MatchString(u.Name) {
		return fmt.Errorf("directory: user name %q must be lower case letters, digits, '.', '_' or '-'", u.Name)
	}
	if u.DisplayName == "" {
		u.DisplayName = u.Name
	}
	var hash []byte
	if password != "" {
		if len(password) < MinPasswordLen {
			return fmt.Errorf("directory: password must be at least %d characters", MinPasswordLen)
		}
		var err error
		if hash, err = bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost); err != nil {
			return fmt.Errorf("directory: hash password: %w", err)
		}
	}
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO arap.users (name, display_name, email, password_hash, created_at) VALUES ($1, $2, nullif($3, ''), $4, now())`,
			u.Name, u.DisplayName, strings.ToLower(u.Email), hash)
		if isUnique(err) {
			return ErrExists
		}
		if err != nil {
			return fmt.Errorf("directory: create user: %w", err)
		}
		return changed(ctx, tx, audit.Event{Chain: audit.SystemChain, Kind: "user.created", Actor: by,
			Data: map[string]any{"user": u.Name, "email": u.Email}})
	})
}

// SetPassword replaces a user's password.
func (s *Store) SetPassword(ctx context.Context, name, password, by string) error {
	if len(password) < MinPasswordLen {
		return fmt.Errorf("directory: password must be at least %d characters", MinPasswordLen)
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE arap.users SET password_hash = $2 WHERE name = $1`, name, hash)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrNotFound
		}
		return audit.Append(ctx, tx, audit.Event{Chain: audit.SystemChain, Kind: "user.password_set", Actor: by, Data: map[string]any{"user": name}})
	})
}

// DisableUser stops a user from signing in and from deciding.
func (s *Store) DisableUser(ctx context.Context, name, by string) error {
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE arap.users SET disabled_at = coalesce(disabled_at, now()) WHERE name = $1`, name)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrNotFound
		}
		return changed(ctx, tx, audit.Event{Chain: audit.SystemChain, Kind: "user.disabled", Actor: by, Data: map[string]any{"user": name}})
	})
}

// Deciding re-reads user name inside a decision's transaction tx (package
// requests calls it at every person's vote): their current groups and
// identities, and whether they may decide at all (active: they exist and
// are not disabled). The user's row and memberships are locked FOR SHARE
// until tx ends, so disabling them or removing them from a group waits for
// a vote in flight, and a vote after such a change sees it: an
// administrator told "disabled" never sees a vote of theirs recorded after.
func (s *Store) Deciding(ctx context.Context, tx pgx.Tx, name string) (groups []string, ids []identity.ID, active bool, err error) {
	var u User
	b := &pgx.Batch{}
	b.Queue(`SELECT name, coalesce(email, ''), disabled_at FROM arap.users WHERE name = $1 FOR SHARE`, name).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&u.Name, &u.Email, &u.DisabledAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	b.Queue(`SELECT group_name FROM arap.group_members WHERE user_name = $1 ORDER BY group_name FOR SHARE`, name).Query(func(rows pgx.Rows) error {
		u.Groups, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, nil, false, fmt.Errorf("directory: %s deciding: %w", name, err)
	}
	if u.Name == "" || u.DisabledAt != nil {
		return nil, nil, false, nil
	}
	return u.Groups, u.Identities(), true, nil
}

// dummyHash makes a sign-in for an unknown user cost what a real one does, so
// timing does not tell which user names exist.
var dummyHash, _ = bcrypt.GenerateFromPassword([]byte("no such user, no such password"), bcrypt.DefaultCost)

// CheckPassword returns the user if password is theirs.
func (s *Store) CheckPassword(ctx context.Context, name, password string) (*User, error) {
	name = strings.ToLower(name)
	var hash []byte
	err := pgx.ErrNoRows // a name that cannot exist is not looked up
	if ValidName(name) {
		err = s.db.QueryRow(ctx, `SELECT password_hash FROM arap.users WHERE name = $1`, name).Scan(&hash)
	}
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && hash == nil) {
		s.checks.Add(1)
		_ = bcrypt.CompareHashAndPassword(dummyHash, []byte(password))
		return nil, ErrBadPassword
	}
	if err != nil {
		return nil, fmt.Errorf("directory: check password: %w", err)
	}
	s.checks.Add(1)
	if bcrypt.CompareHashAndPassword(hash, []byte(password)) != nil {
		return nil, ErrBadPassword
	}
	u, err := s.User(ctx, name)
	if err != nil {
		return nil, err
	}
	if u.DisabledAt != nil {
		return nil, ErrUserDisabled
	}
	return u, nil
}

const selectUser = `SELECT u.name, u.display_name, coalesce(u.email, ''), u.created_at, u.disabled_at,
	coalesce(array_agg(m.group_name ORDER BY m.group_name) FILTER (WHERE m.group_name IS NOT NULL), '{}')
	FROM arap.users u LEFT JOIN arap.group_members m ON m.user_name = u.name`

func scanUser(row pgx.Row) (*User, error) {
	var u User
	err := row.Scan(&u.Name, &u.DisplayName, &u.Email, &u.CreatedAt, &u.DisabledAt, &u.Groups)
	return &u, err
}

// User returns one user with their groups.
func (s *Store) User(ctx context.Context, name string) (*User, error) {
	u, err := scanUser(s.db.QueryRow(ctx, selectUser+` WHERE u.name = $1 GROUP BY u.name`, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("directory: user %s: %w", name, err)
	}
	return u, nil
}

// Find returns the active user a claimed identifier names: their user
// name or e-mail address, compared case-insensitively (identity.Name) and
// read as written, never with a type prefix removed. ErrNotFound when no
// active user has that identity.
func (s *Store) Find(ctx context.Context, claimed string) (*User, error) {
	// Names are stored lower case and e-mail addresses lowercased, so the
	// index finds the candidates; identity.Is then decides.
	rows, err := s.db.Query(ctx, selectUser+` WHERE (u.name = lower($1) OR u.email = lower($1)) AND u.disabled_at IS NULL
		GROUP BY u.name ORDER BY u.name LIMIT 2`, claimed)
	if err != nil {
		return nil, fmt.Errorf("directory: find %q: %w", claimed, err)
	}
	defer rows.Close()
	var found []*User
	for rows.Next() {
		u, err := scanUser(rows)
		if err != nil {
			return nil, fmt.Errorf("directory: find %q: %w", claimed, err)
		}
		if u.Name == strings.ToLower(claimed) || u.Email == strings.ToLower(claimed) {
			if identity.Any(u.Identities(), claimed) {
				found = append(found, u)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("directory: find %q: %w", claimed, err)
	}
	switch len(found) {
	case 0:
		return nil, ErrNotFound
	case 1:
	default:
		// One user's name is another's address, or two accounts share an
		// address (a local one and one from single sign-on): which one is
		// meant cannot be told, and "nobody" would let a condition that
		// asks has() pass, so it is an error.
		return nil, fmt.Errorf("%w: %q names more than one active user", ErrAmbiguous, claimed)
	}
	return found[0], nil
}

// Users lists every user.
func (s *Store) Users(ctx context.Context) ([]*User, error) {
	rows, err := s.db.Query(ctx, selectUser+` GROUP BY u.name ORDER BY u.name`)
	if err != nil {
		return nil, fmt.Errorf("directory: users: %w", err)
	}
	defer rows.Close()
	var out []*User
	for rows.Next() {
		u, err := scanUser(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, rows.Err()
}

// CreateGroup adds a group.
func (s *Store) CreateGroup(ctx context.Context, name, by string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("directory: group name %q must be lower case letters, digits, '.', '_' or '-'", name)
	}
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO arap.groups (name, created_at) VALUES ($1, now())`, name)
		if isUnique(err) {
			return ErrExists
		}
		if err != nil {
			return err
		}
		return changed(ctx, tx, audit.Event{Chain: audit.SystemChain, Kind: "group.created", Actor: by, Data: map[string]any{"group": name}})
	})
}

// AddMember puts user into group (idempotent).
func (s *Store) AddMember(ctx context.Context, group, user, by string) error {
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO arap.group_members (group_name, user_name)
			SELECT g.name, u.name FROM arap.groups g, arap.users u WHERE g.name = $1 AND u.name = $2
			ON CONFLICT DO NOTHING`, group, user)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			var ok bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM arap.group_members WHERE group_name = $1 AND user_name = $2)`, group, user).Scan(&ok); err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("%w: group %q or user %q", ErrNotFound, group, user)
			}
			return nil
		}
		return changed(ctx, tx, audit.Event{Chain: audit.SystemChain, Kind: "group.member_added", Actor: by,
			Data: map[string]any{"group": group, "user": user}})
	})
}

// RemoveMember takes user out of group.
func (s *Store) RemoveMember(ctx context.Context, group, user, by string) error {
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM arap.group_members WHERE group_name = $1 AND user_name = $2`, group, user)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrNotFound
		}
		return changed(ctx, tx, audit.Event{Chain: audit.SystemChain, Kind: "group.member_removed", Actor: by,
			Data: map[string]any{"group": group, "user": user}})
	})
}

// Groups lists groups and their members.
func (s *Store) Groups(ctx context.Context) (map[string][]string, error) {
	rows, err := s.db.Query(ctx, `SELECT g.name, coalesce(array_agg(m.user_name ORDER BY m.user_name) FILTER (WHERE m.user_name IS NOT NULL), '{}')
		FROM arap.groups g LEFT JOIN arap.group_members m ON m.group_name = g.name GROUP BY g.name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var g string
		var members []string
		if err := rows.Scan(&g, &members); err != nil {
			return nil, err
		}
		out[g] = members
	}
	return out, rows.Err()
}

// changed records a change of the directory in tx: its audit event, and
// its announcement to the front-ends' decision caches (package announce),
// which a policy reading subject_attributes from the directory depends on.
func changed(ctx context.Context, tx pgx.Tx, ev audit.Event) error {
	if err := announce.In(ctx, tx, announce.Directory, ""); err != nil {
		return fmt.Errorf("directory: %w", err)
	}
	return audit.Append(ctx, tx, ev)
}

func isUnique(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}
