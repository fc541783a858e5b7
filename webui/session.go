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
	"github.com/omcp/arap/internal/dbdown"
)

// Sessions.
const (
	sessionTTL   = 8 * time.Hour
	cookieName   = "arap_session"
	loginCSRFKey = "arap_login_csrf"
)

type session struct {
	user       *directory.User
	csrf       string
	signedInAt time.Time
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

// signIn checks a password, within the throttle (throttle.go), and opens a
// session. It returns the session id and the browser's device id.
func (u *UI) signIn(ctx context.Context, r *http.Request, name, password string) (sid, device string, err error) {
	if !directory.ValidName(name) {
		// No account has this name, so no password is checked and nothing
		// is charged; it also keeps bytes PostgreSQL refuses out of SQL.
		return "", "", directory.ErrBadPassword
	}
	a, err := u.charge(ctx, r, name)
	if err != nil {
		return "", "", err
	}
	user, err := u.d.Directory.CheckPassword(ctx, name, password)
	if err != nil {
		if w := delay(a.n); w > 0 && (errors.Is(err, directory.ErrBadPassword) || errors.Is(err, directory.ErrUserDisabled)) {
			return "", "", &wrongPasswordError{err: err, wait: w}
		}
		return "", "", err
	}
	var id string
	if err := pgx.BeginFunc(ctx, u.d.DB, func(tx pgx.Tx) error {
		if device, err = u.succeeded(ctx, tx, r, a); err != nil {
			return err
		}
		id, err = u.openSession(ctx, tx, user.Name, "", "")
		return err
	}); err != nil {
		return "", "", err
	}
	return id, device, nil
}

// openSession stores a new session of user and returns its id. A session
// opened through an OpenID provider keeps the provider's issuer and the
// subject (both empty for a password sign-in).
func (u *UI) openSession(ctx context.Context, tx pgx.Tx, user, issuer, subject string) (string, error) {
	// Sessions that ended are swept here rather than by a job: sign-ins
	// are rare and the table stays small.
	if _, err := tx.Exec(ctx, `DELETE FROM arap.ui_sessions WHERE expires_at < $1`, u.now()); err != nil {
		return "", err
	}
	id := randomToken()
	_, err := tx.Exec(ctx, `INSERT INTO arap.ui_sessions (id_hash, user_name, csrf, created_at, expires_at, oidc_issuer, oidc_subject)
		VALUES ($1, $2, $3, $4, $5, nullif($6, ''), nullif($7, ''))`,
		hashID(id), user, randomToken(), u.now(), u.now().Add(sessionTTL), issuer, subject)
	return id, err
}

// wrongPasswordError is a failed attempt after which the client must wait.
type wrongPasswordError struct {
	err  error
	wait time.Duration
}

func (e *wrongPasswordError) Error() string { return e.err.Error() }
func (e *wrongPasswordError) Unwrap() error { return e.err }

// current returns the request's session, or nil.
func (u *UI) current(r *http.Request) (*session, error) {
	c, err := r.Cookie(cookieName)
	if err != nil || c.Value == "" {
		return nil, nil
	}
	var name, csrf string
	var created, expires time.Time
	err = u.d.DB.QueryRow(r.Context(), `SELECT user_name, csrf, created_at, expires_at FROM arap.ui_sessions WHERE id_hash = $1`, hashID(c.Value)).
		Scan(&name, &csrf, &created, &expires)
	if dbdown.Is(err) {
		// Not "signed out": the session may well be valid.
		return nil, err
	}
	if err != nil || u.now().After(expires) {
		return nil, nil
	}
	user, err := u.d.Directory.User(r.Context(), name)
	if dbdown.Is(err) {
		return nil, err
	}
	if err != nil || user.DisabledAt != nil {
		return nil, nil
	}
	return &session{user: user, csrf: csrf, signedInAt: created}, nil
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
