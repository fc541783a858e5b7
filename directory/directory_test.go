package directory_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/directory"
	"github.com/omcp/arap/identity"
	"github.com/omcp/arap/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func TestUsersGroupsPasswords(t *testing.T) {
	ctx := context.Background()
	s := directory.NewStore(dbtest.New(t))
	require.NoError(t, s.CreateUser(ctx, directory.User{Name: "bob", Email: "Bob@Example.com"}, "dev-password", "t"))
	require.ErrorIs(t, s.CreateUser(ctx, directory.User{Name: "bob"}, "", "t"), directory.ErrExists)
	require.Error(t, s.CreateUser(ctx, directory.User{Name: "Bad Name"}, "", "t"))
	require.ErrorContains(t, s.CreateUser(ctx, directory.User{Name: "tiny"}, "short", "t"), "at least 8")
	require.NoError(t, s.CreateUser(ctx, directory.User{Name: "nopw"}, "", "t"))

	u, err := s.CheckPassword(ctx, "BOB", "dev-password")
	require.NoError(t, err)
	require.Equal(t, "bob", u.Name)
	require.Equal(t, []identity.ID{identity.Name("bob"), identity.Name("bob@example.com")}, u.Identities())
	_, err = s.CheckPassword(ctx, "bob", "wrong-password")
	require.ErrorIs(t, err, directory.ErrBadPassword)
	_, err = s.CheckPassword(ctx, "ghost", "dev-password")
	require.ErrorIs(t, err, directory.ErrBadPassword, "unknown users look like wrong passwords")
	_, err = s.CheckPassword(ctx, "nopw", "")
	require.ErrorIs(t, err, directory.ErrBadPassword, "no password, no sign-in")

	require.NoError(t, s.CreateGroup(ctx, "treasury", "t"))
	require.NoError(t, s.AddMember(ctx, "treasury", "bob", "t"))
	require.NoError(t, s.AddMember(ctx, "treasury", "bob", "t"), "adding twice is fine")
	require.ErrorIs(t, s.AddMember(ctx, "treasury", "ghost", "t"), directory.ErrNotFound)
	u, err = s.User(ctx, "bob")
	require.NoError(t, err)
	require.Equal(t, []string{"treasury"}, u.Groups)
	require.NoError(t, s.RemoveMember(ctx, "treasury", "bob", "t"))
	u, err = s.User(ctx, "bob")
	require.NoError(t, err)
	require.Empty(t, u.Groups)

	require.NoError(t, s.SetPassword(ctx, "bob", "another-password", "t"))
	_, err = s.CheckPassword(ctx, "bob", "another-password")
	require.NoError(t, err)
	require.NoError(t, s.DisableUser(ctx, "bob", "t"))
	_, err = s.CheckPassword(ctx, "bob", "another-password")
	require.ErrorIs(t, err, directory.ErrUserDisabled)
}
