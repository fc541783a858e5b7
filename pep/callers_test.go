package pep_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/pep"
)

// TestCallerIdentitiesAreCanonical: a caller whose subject or actor the
// backend would refuse as non-canonical is refused when it is made.
func TestCallerIdentitiesAreCanonical(t *testing.T) {
	db := dbtest.New(t)
	g, err := pep.NewGate(pep.Config{DB: db, Backend: &arapclient.Client{BaseURL: "http://127.0.0.1:1", Token: "unused"},
		MasterKey: make([]byte, 32), Tools: pep.DemoTools()})
	require.NoError(t, err)
	ctx := context.Background()
	for _, p := range []pep.Principal{
		{SubjectID: "bob "}, {SubjectID: "b\u200bob"}, {SubjectID: "ｂｏｂ"}, {SubjectID: "bob", ActorID: "agent:demo\u202e"},
		{SubjectID: "bob", SubjectType: " user"},
	} {
		err := g.Callers().Create(ctx, "c", "token-0123456789", p)
		require.Error(t, err, "%+v", p)
	}
	require.NoError(t, g.Callers().Create(ctx, "c", "token-0123456789", pep.Principal{SubjectID: "bob", ActorID: "agent:demo"}))
}

// startedGate is a gate on db, started (its callers' listener runs) and
// stopped at the end of the test.
func startedGate(t *testing.T, db *pgxpool.Pool) *pep.Gate {
	t.Helper()
	g, err := pep.NewGate(pep.Config{DB: db, Backend: &arapclient.Client{BaseURL: "http://127.0.0.1:1", Token: "unused"},
		MasterKey: make([]byte, 32), Tools: pep.DemoTools()})
	require.NoError(t, err)
	require.NoError(t, g.Start(context.Background()))
	t.Cleanup(g.Stop)
	return g
}

// remembers authenticates token on g until g remembers its principal (its
// listener must be live first), so what follows tests the memory, not the
// table.
func remembers(t *testing.T, g *pep.Gate, token string) {
	t.Helper()
	ctx := context.Background()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		_, err := g.Callers().Authenticate(ctx, token)
		require.NoError(c, err) // CollectT: a failure here ends this tick, not the test's goroutine
		_, _, n := g.CallerMemory()
		assert.Positive(c, n, "the gate never remembered the caller")
	}, 10*time.Second, 10*time.Millisecond)
}

// TestRevokedCallerRefusedByEveryReplica: a caller's token revoked by
// arapctl (a Callers of its own, no gate) is refused by every running
// replica that had remembered it, at once rather than after the memory's
// lifetime (a minute): the revocation's notification empties each memory.
func TestRevokedCallerRefusedByEveryReplica(t *testing.T) {
	db := dbtest.New(t)
	ctx := context.Background()
	a, b := startedGate(t, db), startedGate(t, db)
	require.NoError(t, a.Callers().Create(ctx, "agent-1", "token-agent-1-0123", pep.Principal{SubjectID: "bob", ActorID: "agent:demo"}))
	remembers(t, a, "token-agent-1-0123")
	remembers(t, b, "token-agent-1-0123")

	require.NoError(t, (&pep.Callers{DB: db}).Revoke(ctx, "agent-1"))
	for _, g := range []*pep.Gate{a, b} {
		require.Eventually(t, func() bool {
			_, err := g.Callers().Authenticate(ctx, "token-agent-1-0123")
			return errors.Is(err, pep.ErrUnknownCaller)
		}, 5*time.Second, 5*time.Millisecond, "a replica still serves the revoked token from memory")
	}
}

// TestCallerMemoryEmptiedWhenListenerLost: a revocation whose notification
// the replica could not hear (its listening connection was lost: here the
// revocation is written without one, then the connection is killed) is
// not served from memory once the listener is back.
func TestCallerMemoryEmptiedWhenListenerLost(t *testing.T) {
	db := dbtest.New(t)
	ctx := context.Background()
	g := startedGate(t, db)
	require.NoError(t, g.Callers().Create(ctx, "agent-1", "token-agent-1-0123", pep.Principal{SubjectID: "bob", ActorID: "agent:demo"}))
	remembers(t, g, "token-agent-1-0123")

	_, err := db.Exec(ctx, `UPDATE pep.callers SET revoked_at = now() WHERE name = 'agent-1'`) // no notification
	require.NoError(t, err)
	_, before, _ := g.CallerMemory()
	var killed bool
	require.NoError(t, db.QueryRow(ctx, `SELECT bool_or(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`,
		pep.CallersListener).Scan(&killed))
	require.True(t, killed, "no listening connection to kill")
	require.Eventually(t, func() bool {
		live, listens, _ := g.CallerMemory()
		return live && listens > before
	}, 10*time.Second, 5*time.Millisecond, "the listener did not reconnect")
	_, err = g.Callers().Authenticate(ctx, "token-agent-1-0123")
	require.ErrorIs(t, err, pep.ErrUnknownCaller)
}

// TestCallersWithoutListenerReadTheTable: a gate that was not started (no
// listener) remembers nothing, so a revocation without any notification
// takes effect at the next request.
func TestCallersWithoutListenerReadTheTable(t *testing.T) {
	db := dbtest.New(t)
	ctx := context.Background()
	g, err := pep.NewGate(pep.Config{DB: db, Backend: &arapclient.Client{BaseURL: "http://127.0.0.1:1", Token: "unused"},
		MasterKey: make([]byte, 32), Tools: pep.DemoTools()})
	require.NoError(t, err)
	require.NoError(t, g.Callers().Create(ctx, "agent-1", "token-agent-1-0123", pep.Principal{SubjectID: "bob", ActorID: "agent:demo"}))
	_, err = g.Callers().Authenticate(ctx, "token-agent-1-0123")
	require.NoError(t, err)
	_, err = db.Exec(ctx, `UPDATE pep.callers SET revoked_at = now() WHERE name = 'agent-1'`)
	require.NoError(t, err)
	_, err = g.Callers().Authenticate(ctx, "token-agent-1-0123")
	require.ErrorIs(t, err, pep.ErrUnknownCaller)
}
