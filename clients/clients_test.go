package clients_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func TestCreateAuthenticateRevoke(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	s := clients.NewStore(db)
	c, token, err := s.Create(ctx, clients.New{Name: "pep-1", Scopes: []string{"evaluate", "request"}, Kind: "automation", Actors: []string{"agent:*"}}, "operator")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(token, "arap_"))
	require.Greater(t, len(token), 40)

	// Only the hash is stored.
	var n int
	require.NoError(t, db.QueryRow(ctx, "SELECT count(*) FROM arap.api_clients WHERE token_hash = $1::text::bytea", token).Scan(&n))
	require.Zero(t, n)

	got, err := s.Authenticate(ctx, token)
	require.NoError(t, err)
	require.Equal(t, c.ID, got.ID)
	require.True(t, got.Has("request"))
	require.False(t, got.Has("decide"))
	require.True(t, got.MayAssertActor("agent:demo"))
	require.False(t, got.MayAssertActor("user:bob"))

	_, err = s.Authenticate(ctx, token+"x")
	require.ErrorIs(t, err, clients.ErrUnauthenticated)
	_, err = s.Authenticate(ctx, "")
	require.ErrorIs(t, err, clients.ErrUnauthenticated)

	_, err = s.Revoke(ctx, "pep-1", "operator")
	require.NoError(t, err)
	_, err = clients.NewStore(db).Authenticate(ctx, token)
	require.ErrorIs(t, err, clients.ErrUnauthenticated, "a revoked token is refused")
	_, err = s.Authenticate(ctx, token)
	require.ErrorIs(t, err, clients.ErrUnauthenticated, "revoking clears this store's cache")

	recs, err := audit.Chain(ctx, db, audit.SystemChain)
	require.NoError(t, err)
	require.Len(t, recs, 2)
	require.Equal(t, "client.created", recs[0].Kind)
	require.Equal(t, "client.revoked", recs[1].Kind)
	require.NotContains(t, string(recs[0].Data), token, "tokens never reach the audit trail")
}

func TestCreateValidates(t *testing.T) {
	ctx := context.Background()
	s := clients.NewStore(dbtest.New(t))
	for _, n := range []clients.New{
		{Name: "", Scopes: []string{"evaluate"}, Kind: "automation"},
		{Name: "x", Scopes: nil, Kind: "automation"},
		{Name: "x", Scopes: []string{"root"}, Kind: "automation"},
		{Name: "x", Scopes: []string{"evaluate"}, Kind: "robot"},
		{Name: "x", Scopes: []string{"evaluate"}, Kind: "automation", Token: "short"},
	} {
		_, _, err := s.Create(ctx, n, "t")
		require.Error(t, err, "%+v", n)
	}
	_, _, err := s.Create(ctx, clients.New{Name: "dup", Scopes: []string{"evaluate"}, Kind: "itsm", Token: "fixed-token-1234"}, "t")
	require.NoError(t, err)
	_, _, err = s.Create(ctx, clients.New{Name: "dup", Scopes: []string{"evaluate"}, Kind: "itsm"}, "t")
	require.ErrorIs(t, err, clients.ErrNameTaken)
	c, err := s.Authenticate(ctx, "fixed-token-1234")
	require.NoError(t, err)
	require.Equal(t, "itsm", c.Kind)
	list, err := s.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
}
