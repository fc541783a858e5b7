// Package dbdown says whether an error means "the database is unavailable"
// (PostgreSQL stopped, restarting, unreachable), the one failure both
// processes answer as retryable (HTTP 503 with Retry-After, a JSON-RPC
// error saying so) instead of as an internal error. It is a leaf: the
// backend and the MCP front-end both import it.
package dbdown

import (
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// RetryAfter is what both processes ask a client to wait before retrying
// while the database is unavailable: short, because a restart takes seconds.
const RetryAfter = 2 * time.Second

// RetryAfterHeader is RetryAfter as a Retry-After header value (seconds).
var RetryAfterHeader = strconv.Itoa(int(RetryAfter / time.Second))

// Is reports whether err says the database is unavailable: it could not be
// reached, refused a connection while starting or shutting down, dropped
// the connection, or is read-only (ReadOnly: a standby, as a stale DNS name
// or a pooler pointing at a former primary gives after a failover). An
// error the server gave about the statement itself (a unique violation, a
// syntax error) is not: retrying would not help.
func Is(err error) bool {
	if err == nil {
		return false
	}
	// The server's own answer decides, even inside a ConnectError (a server
	// starting up refuses with 57P03; a wrong password is 28P01, not an
	// outage).
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return unavailableCode(pe.Code) || refusedInRecovery(pe)
	}
	if errors.Is(err, ErrReadOnly) {
		return true
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return true
	}
	if errors.Is(err, pgconn.ErrConnClosed) || pgconn.Timeout(err) {
		return true
	}
	// The network failed under the driver: refused, reset, unreachable
	// (*net.OpError, also inside a ConnectError), or the server closed a
	// pooled connection between statements (a fast shutdown): the next
	// read ends early (io.ErrUnexpectedEOF, unwrapped by pgconn).
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF)
}

// unavailableCode: SQLSTATE class 08 (connection exception), the
// server shutting down or starting (57P01 admin_shutdown, 57P02
// crash_shutdown, 57P03 cannot_connect_now) and 53300
// too_many_connections (a restart's reconnect storm).
func unavailableCode(code string) bool {
	switch code {
	case "57P01", "57P02", "57P03", "53300":
		return true
	}
	return len(code) == 5 && code[:2] == "08"
}

// ErrReadOnly says the database refuses writes: it is in recovery (a
// standby) or its transactions are read-only (default_transaction_read_only).
// Host readiness checks wrap it; Is counts it as unavailable.
var ErrReadOnly = errors.New("the database is read-only")

// ReadOnly reports whether err is a read-only server's refusal (ReadOnly
// errors, and the SQLSTATEs refusedInRecovery lists).
func ReadOnly(err error) bool {
	if errors.Is(err, ErrReadOnly) {
		return true
	}
	var pe *pgconn.PgError
	return errors.As(err, &pe) && refusedInRecovery(pe)
}

// refusedInRecovery: a server that cannot write now refused the statement,
// which therefore did not apply (NotSent): 25006 read_only_sql_transaction
// (a write, LISTEN or NOTIFY on a hot standby or in a read-only
// transaction), 40001 when it is a standby's "conflict with recovery" (a
// read cancelled because replay needed what it held; a serialization
// failure of a primary is not: its transaction is the one to retry), and
// XX000 "cannot assign TransactionIds|OIDs during recovery" (elog, not
// translated). Not 55000 object_not_in_prerequisite_state: a primary
// answers it too.
func refusedInRecovery(pe *pgconn.PgError) bool {
	switch pe.Code {
	case "25006":
		return true
	case "40001":
		return strings.Contains(pe.Message, "conflict with recovery")
	case "XX000":
		return strings.Contains(pe.Message, "during recovery")
	}
	return false
}

// NotSent reports whether err (an unavailability, Is) happened before the
// statement reached the server, or reached a server that refused it
// without applying anything, so that sending it again cannot apply it
// twice: no connection could be made (or the server refused one while
// starting, or had too many), the driver says nothing was sent, or a
// read-only server refused it (ReadOnly: nothing of its transaction can
// have been written there). A connection lost mid-statement is not: the
// statement may have committed.
func NotSent(err error) bool {
	if ReadOnly(err) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "57P03" || pe.Code == "53300") {
		return true
	}
	var ce *pgconn.ConnectError
	return errors.As(err, &ce) || pgconn.SafeToRetry(err)
}
