package attributes_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/attributes"
	"github.com/omcp/arap/directory"
	"github.com/omcp/arap/internal/dbtest"
)

// TestDirectorySubjects: a user subject is looked up by user name or
// e-mail address, case-insensitively as the directory compares them, never
// with a type prefix read off; a disabled user, another subject type and an
// unknown identity have no attributes.
func TestDirectorySubjects(t *testing.T) {
	ctx := context.Background()
	people := directory.NewStore(dbtest.New(t))
	require.NoError(t, people.CreateUser(ctx, directory.User{Name: "bob", DisplayName: "Bob", Email: "Bob@Example.com"}, "", "test"))
	require.NoError(t, people.CreateUser(ctx, directory.User{Name: "eve", Email: "eve@example.com"}, "", "test"))
	require.NoError(t, people.CreateGroup(ctx, "treasury", "test"))
	require.NoError(t, people.AddMember(ctx, "treasury", "bob", "test"))
	require.NoError(t, people.DisableUser(ctx, "eve", "test"))
	src := attributes.Directory{People: people}

	want := map[string]any{"name": "bob", "display_name": "Bob", "email": "bob@example.com", "groups": []any{"treasury"}}
	for _, id := range []string{"bob", "BOB", "bob@example.com", "Bob@Example.COM"} {
		got, err := src.SubjectAttributes(ctx, "user", id)
		require.NoError(t, err)
		require.Equal(t, want, got, id)
	}
	for _, tc := range []struct{ typ, id string }{
		{"user", "user:bob"}, {"user", "bob "}, {"user", "nobody"}, {"user", "eve"}, {"user", "eve@example.com"}, {"agent", "bob"},
	} {
		got, err := src.SubjectAttributes(ctx, tc.typ, tc.id)
		require.NoError(t, err)
		require.Nil(t, got, "%s %q", tc.typ, tc.id)
	}

	// Two active accounts with one address (a local one and one from
	// single sign-on): an error, which denies, not "nobody".
	require.NoError(t, people.CreateUser(ctx, directory.User{Name: "bob2", Email: "bob@example.com"}, "", "test"))
	_, err := src.SubjectAttributes(ctx, "user", "bob@example.com")
	require.ErrorIs(t, err, directory.ErrAmbiguous)
	got, err := src.SubjectAttributes(ctx, "user", "bob")
	require.NoError(t, err)
	require.Equal(t, "bob", got["name"], "the name alone still names one")

	// Membership is read at every lookup: a change counts at once.
	require.NoError(t, people.RemoveMember(ctx, "treasury", "bob", "test"))
	got, err = src.SubjectAttributes(ctx, "user", "bob")
	require.NoError(t, err)
	require.Equal(t, []any{}, got["groups"])
}
