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
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// RetryAfter is what both processes ask a client to wait before retrying
// while the database is unavailable: short, because a restart takes seconds.
const RetryAfter = 2 * time.Second

// RetryAfterHeader is RetryAfter as a Retry-After header value (seconds).
var RetryAfterHeader = strconv.Itoa(int(RetryAfter / time.Second))

// Is reports whether err says the database is unavailable: it could not be
// reached, refused a connection while starting or shutting down, or dropped
// the connection. An error the server gave about the statement itself (a
// unique violation, a syntax error) is not: retrying would not help.
func Is(err error) bool {
	if err == nil {
		return false
	}
	// The server's own answer decides, even inside a ConnectError (a server
	// starting up refuses with 57P03; a wrong password is 28P01, not an
	// outage).
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return unavailableCode(pe.Code)
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

// NotSent reports whether err (an unavailability, Is) happened before the
// statement reached the server, so that sending it again cannot apply it
// twice: no connection could be made (or the server refused one while
// starting, or had too many), or the driver says nothing was sent. A
// connection lost mid-statement is not: the statement may have committed.
func NotSent(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "57P03" || pe.Code == "53300") {
		return true
	}
	var ce *pgconn.ConnectError
	return errors.As(err, &ce) || pgconn.SafeToRetry(err)
}
