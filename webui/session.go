package webui

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/omcp/arap/directory"
)

// Sign-in limits.
const (
	sessionTTL   = 8 * time.Hour
	maxFailures  = 5
	lockoutSpan  = 15 * time.Minute
	cookieName   = "arap_session"
	loginCSRFKey = "arap_login_csrf"
)

type session struct {
	user *directory.User
	csrf string
}

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

func hashID(id string) []byte {
	h := sha256.Sum256([]byte(id))
	return h[:]
}

func (u *UI) cookie(name, value string, maxAge int) *http.Cookie {
	return &http.Cookie{Name: name, Value: value, Path: "/ui/", MaxAge: maxAge, HttpOnly: true, Secure: u.d.Secure, SameSite: http.SameSiteStrictMode}
}

// locked reports whether user is locked out after repeated failures, and
// until when.
func (u *UI) locked(ctx context.Context, user string) (bool, time.Time, error) {
	var n int
	var last *time.Time
	err := u.d.DB.QueryRow(ctx, `SELECT count(*), max(at) FROM arap.ui_login_failures WHERE user_name = $1 AND at > $2`,
		user, u.now().Add(-lockoutSpan)).Scan(&n, &last)
	if err != nil || n < maxFailures || last == nil {
		return false, time.Time{}, err
	}
	return true, last.Add(lockoutSpan), nil
}

// signIn checks a password (with lock-out) and opens a session.
func (u *UI) signIn(ctx context.Context, name, password string) (string, error) {
	if locked, until, err := u.locked(ctx, name); err != nil {
		return "", err
	} else if locked {
		return "", &lockedError{until: until}
	}
	user, err := u.d.Directory.CheckPassword(ctx, name, password)
	if err != nil {
		if errors.Is(err, directory.ErrBadPassword) || errors.Is(err, directory.ErrUserDisabled) {
			_, _ = u.d.DB.Exec(ctx, `INSERT INTO arap.ui_login_failures (user_name, at) VALUES ($1, $2)`, name, u.now())
		}
		return "", err
	}
	id := randomToken()
	if err := pgx.BeginFunc(ctx, u.d.DB, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM arap.ui_login_failures WHERE user_name = $1 OR at < $2`, user.Name, u.now().Add(-lockoutSpan)); err != nil {
			return err
		}
		// Sessions that ended are swept here rather than by a job: sign-ins
		// are rare and the table stays small.
		if _, err := tx.Exec(ctx, `DELETE FROM arap.ui_sessions WHERE expires_at < $1`, u.now()); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO arap.ui_sessions (id_hash, user_name, csrf, created_at, expires_at) VALUES ($1, $2, $3, $4, $5)`,
			hashID(id), user.Name, randomToken(), u.now(), u.now().Add(sessionTTL))
		return err
	}); err != nil {
		return "", err
	}
	return id, nil
}

type lockedError struct{ until time.Time }

func (e *lockedError) Error() string { return "locked" }

// current returns the request's session, or nil.
func (u *UI) current(r *http.Request) *session {
	c, err := r.Cookie(cookieName)
	if err != nil || c.Value == "" {
		return nil
	}
	var name, csrf string
	var expires time.Time
	err = u.d.DB.QueryRow(r.Context(), `SELECT user_name, csrf, expires_at FROM arap.ui_sessions WHERE id_hash = $1`, hashID(c.Value)).
		Scan(&name, &csrf, &expires)
	if err != nil || u.now().After(expires) {
		return nil
	}
	user, err := u.d.Directory.User(r.Context(), name)
	if err != nil || user.DisabledAt != nil {
		return nil
	}
	return &session{user: user, csrf: csrf}
}

func (u *UI) signOut(r *http.Request) {
	if c, err := r.Cookie(cookieName); err == nil {
		_, _ = u.d.DB.Exec(r.Context(), `DELETE FROM arap.ui_sessions WHERE id_hash = $1`, hashID(c.Value))
	}
}

// checkCSRF verifies a form's token against the session's.
func (u *UI) checkCSRF(r *http.Request, want string) bool {
	got := r.PostFormValue("csrf")
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}
