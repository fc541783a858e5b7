// Package announce tells the MCP front-ends when a decision they remember
// may have changed. A front-end keeps allowed decisions the PDP marked
// cacheable (its decision cache) only while it hears the backend's change
// stream (GET /v1/decisions/changes); the backend feeds that stream from
// Channel, on which every replica announces each change a cacheable
// decision may depend on:
//
//   - a policy reload, once the replica that reloaded has the new policy
//     in force (Now: the policy file is not in the database);
//   - an attribute set or deleted, a directory change (users, groups,
//     memberships), an API client revoked, in the transaction that makes
//     the change (In), so it is heard when, and only if, it commits, by
//     whichever replica the front-end's stream is connected to.
//
// A Hub is one replica's listener: it passes every announcement to the
// streams it serves, and ends them all when it stops listening, since
// changes made meanwhile are not heard.
package announce

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/omcp/arap/authzen"
)

// Channel is the PostgreSQL notification channel of the announcements.
const Channel = "arap_decision_inputs"

// What changed: an announcement's payload is a kind, or a kind, ":" and
// what it is about (the revoked client's id). The kinds are the change
// stream's, whose wire names authzen keeps.
const (
	Policy     = authzen.ChangePolicy
	Attributes = authzen.ChangeAttributes
	Directory  = authzen.ChangeDirectory
	Client     = authzen.ChangeClient
)

// Execer is a transaction or a pool.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// In announces a change of kind (about detail, "" for none) made in tx:
// delivered when tx commits, never if it rolls back. Announcements of one
// transaction with the same payload are delivered once.
func In(ctx context.Context, tx Execer, kind, detail string) error {
	payload := kind
	if detail != "" {
		payload += ":" + detail
	}
	if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, Channel, payload); err != nil {
		return fmt.Errorf("announce %s: %w", kind, err)
	}
	return nil
}

// Now announces a change that is not in the database (a policy reload)
// through db, at once.
func Now(ctx context.Context, db Execer, kind string) error { return In(ctx, db, kind, "") }
