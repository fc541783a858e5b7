package webui

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/omcp/arap/internal/clientip"
)

// Sign-in throttling. Failed sign-ins never lock an account out; they slow
// the client that made them, and bound how fast anyone can guess one
// account's password:
//
//   - Per (account, client). A client is the browser, when it has signed in
//     as this account before (its arap_device cookie), else its address
//     (an IPv6 address by its /64, which one host commonly holds whole). The
//     first freeAttempts attempts since the client's last success are free;
//     each one after that makes the next wait 1 s, 2 s, 4 s ... up to
//     maxDelay. An attacker at one address slows only that address.
//   - Per account, for browsers not known for it: at most accountBurst
//     password checks, refilled at one per accountWindow/accountBurst (a
//     generic cell rate), however many addresses the guesses come from. A
//     browser that has signed in as the account before does not draw on it,
//     so guesses spread over many addresses cannot lock the real user out.
//
// An attempt is charged, atomically in PostgreSQL, before its password is
// checked, so parallel attempts (on any replica) cannot overtake the count;
// a success gives the charge back. A refused attempt checks no password and
// changes nothing.
const (
	freeAttempts  = 3
	maxDelay      = 15 * time.Minute
	forgetAfter   = 24 * time.Hour // a client's count restarts after a day without attempts
	accountBurst  = 10
	accountWindow = 15 * time.Minute
	deviceTTL     = 90 * 24 * time.Hour
	deviceCookie  = "arap_device"
)

// accountInterval is how often the account budget regains one check.
const accountInterval = accountWindow / accountBurst

// delay is how long a client must wait after its nth attempt (counted since
// its last success) before the next one.
func delay(n int) time.Duration {
	if n <= freeAttempts {
		return 0
	}
	shift := n - freeAttempts - 1
	if shift >= 20 {
		return maxDelay
	}
	return min(time.Second<<shift, maxDelay)
}

// throttledError refuses an attempt without checking its password.
type throttledError struct {
	retry   time.Duration
	account bool // the account-wide budget for unknown browsers, not this client's delay
}

func (e *throttledError) Error() string {
	return fmt.Sprintf("sign-in throttled for %s", e.retry)
}

// attempt is a charged sign-in attempt.
type attempt struct {
	user   string
	client string // "device:<hash prefix>" or "addr:<address>"
	device []byte // the known device's id hash, when the browser is known for user
	n      int    // the client's attempts since its last success, this one included
}

// knownDevice returns the hash of the browser's device id if it has signed
// in as user before, else nil.
func (u *UI) knownDevice(ctx context.Context, r *http.Request, user string) ([]byte, error) {
	c, err := r.Cookie(deviceCookie)
	if err != nil || c.Value == "" || len(c.Value) > 100 {
		return nil, nil
	}
	h := hashID(c.Value)
	var ok bool
	err = u.d.DB.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM arap.ui_devices WHERE id_hash = $1 AND user_name = $2 AND expires_at > $3)`,
		h, user, u.now()).Scan(&ok)
	if err != nil || !ok {
		return nil, err
	}
	return h, nil
}

// charge admits and charges one attempt to sign in as user, or refuses it
// with a *throttledError.
func (u *UI) charge(ctx context.Context, r *http.Request, user string) (*attempt, error) {
	a := &attempt{user: user, client: "addr:" + clientip.Key(r)}
	var err error
	if a.device, err = u.knownDevice(ctx, r, user); err != nil {
		return nil, err
	}
	if a.device != nil {
		a.client = "device:" + hex.EncodeToString(a.device[:16])
	}
	now := u.now()
	err = pgx.BeginFunc(ctx, u.d.DB, func(tx pgx.Tx) error {
		// The client's count: one conditional upsert, refused (no row) while
		// the client is waiting. The row stays locked until commit, so the
		// delay set next is seen by any concurrent attempt.
		err := tx.QueryRow(ctx, `INSERT INTO arap.ui_login_clients AS c (user_name, client, attempts, last_at, blocked_until)
			VALUES ($1, $2, 1, $3, $3)
			ON CONFLICT (user_name, client) DO UPDATE
			SET attempts = CASE WHEN c.last_at < $4 THEN 1 ELSE c.attempts + 1 END, last_at = $3
			WHERE c.blocked_until <= $3
			RETURNING attempts`, a.user, a.client, now, now.Add(-forgetAfter)).Scan(&a.n)
		if errors.Is(err, pgx.ErrNoRows) {
			var until time.Time
			if err := tx.QueryRow(ctx, `SELECT blocked_until FROM arap.ui_login_clients WHERE user_name = $1 AND client = $2`,
				a.user, a.client).Scan(&until); err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			return &throttledError{retry: until.Sub(now)}
		}
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE arap.ui_login_clients SET blocked_until = $3 WHERE user_name = $1 AND client = $2`,
			a.user, a.client, now.Add(delay(a.n))); err != nil {
			return err
		}
		if a.device != nil {
			return nil
		}
		// The account's budget for unknown browsers: admitted while the
		// theoretical arrival time stays within one window of now. Refusal
		// rolls back the client's charge too.
		err = tx.QueryRow(ctx, `INSERT INTO arap.ui_login_accounts AS b (user_name, tat) VALUES ($1, $2::timestamptz + $3::interval)
			ON CONFLICT (user_name) DO UPDATE SET tat = greatest(b.tat, $2) + $3::interval
			WHERE greatest(b.tat, $2) + $3::interval <= $2::timestamptz + $4::interval
			RETURNING 1`, a.user, now, accountInterval, accountWindow).Scan(new(int))
		if errors.Is(err, pgx.ErrNoRows) {
			var tat time.Time
			if err := tx.QueryRow(ctx, `SELECT tat FROM arap.ui_login_accounts WHERE user_name = $1`, a.user).Scan(&tat); err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			return &throttledError{retry: tat.Add(accountInterval - accountWindow).Sub(now), account: true}
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return a, nil
}

// succeeded gives a successful attempt's charge back and records the
// browser as known for the account; it returns the device id for the
// browser's cookie (a new one unless the browser was already known).
func (u *UI) succeeded(ctx context.Context, tx pgx.Tx, r *http.Request, a *attempt) (string, error) {
	now := u.now()
	if _, err := tx.Exec(ctx, `DELETE FROM arap.ui_login_clients WHERE user_name = $1 AND client = $2`, a.user, a.client); err != nil {
		return "", err
	}
	var device string
	if a.device != nil {
		c, _ := r.Cookie(deviceCookie)
		device = c.Value
	} else {
		if _, err := tx.Exec(ctx, `UPDATE arap.ui_login_accounts SET tat = tat - $2::interval WHERE user_name = $1`, a.user, accountInterval); err != nil {
			return "", err
		}
		// Never adopt an id the browser brought: a planted cookie must not
		// become known for this account.
		device = randomToken()
	}
	if _, err := tx.Exec(ctx, `INSERT INTO arap.ui_devices (id_hash, user_name, expires_at) VALUES ($1, $2, $3)
		ON CONFLICT (id_hash, user_name) DO UPDATE SET expires_at = excluded.expires_at`, hashID(device), a.user, now.Add(deviceTTL)); err != nil {
		return "", err
	}
	// Rows that no longer matter are swept here rather than by a job:
	// sign-ins are rare and the tables stay small.
	for _, q := range []struct {
		sql    string
		before time.Time
	}{
		{`DELETE FROM arap.ui_login_clients WHERE last_at < $1`, now.Add(-forgetAfter)},
		{`DELETE FROM arap.ui_devices WHERE expires_at < $1`, now},
		{`DELETE FROM arap.ui_login_accounts WHERE tat < $1`, now}, // a full budget is no row
	} {
		if _, err := tx.Exec(ctx, q.sql, q.before); err != nil {
			return "", err
		}
	}
	return device, nil
}
