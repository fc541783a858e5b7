package directory_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/directory"
	"github.com/omcp/arap/internal/dbtest"
)

const issuer = "https://idp.example.com"

func TestSignInExternalCreatesThenUpdates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.New(t)
	s := directory.NewStore(db)
	ext := directory.External{Issuer: issuer, Subject: "sub-1", PreferredName: "Zoe.Q@corp.example", DisplayName: "Zoe Q",
		Email: "Zoe@Corp.Example", EmailVerified: true}
	u, err := s.SignInExternal(ctx, ext)
	require.NoError(t, err)
	require.Equal(t, "zoe.q", u.Name)
	require.Equal(t, "Zoe Q", u.DisplayName)
	require.Equal(t, "zoe@corp.example", u.Email)

	ext.DisplayName, ext.Email, ext.PreferredName = "Zoe Quinn", "zq@corp.example", "renamed"
	u, err = s.SignInExternal(ctx, ext)
	require.NoError(t, err)
	require.Equal(t, "zoe.q", u.Name, "the name stays: the link is the identity")
	require.Equal(t, "Zoe Quinn", u.DisplayName)
	require.Equal(t, "zq@corp.example", u.Email)

	kinds := systemKinds(t, db)
	require.Contains(t, kinds, "user.created")
	require.Contains(t, kinds, "user.updated")
}

func TestSignInExternalUnverifiedEmailNotStored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := directory.NewStore(dbtest.New(t))
	ext := directory.External{Issuer: issuer, Subject: "sub-1", PreferredName: "", DisplayName: "Mal", Email: "bob@example.com"}
	u, err := s.SignInExternal(ctx, ext)
	require.NoError(t, err)
	require.Empty(t, u.Email, "an unverified address is not stored")
	require.Equal(t, "user", u.Name, "nor used for the name")

	ext.EmailVerified = true
	u, err = s.SignInExternal(ctx, ext)
	require.NoError(t, err)
	require.Equal(t, "bob@example.com", u.Email)
	ext.EmailVerified = false
	u, err = s.SignInExternal(ctx, ext)
	require.NoError(t, err)
	require.Empty(t, u.Email, "an address the provider no longer vouches for is dropped")
}

func TestSignInExternalNeverTakesOverAName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := directory.NewStore(dbtest.New(t))
	require.NoError(t, s.CreateUser(ctx, directory.User{Name: "bob", Email: "bob@example.com"}, "dev-password", "t"))
	require.NoError(t, s.CreateGroup(ctx, "treasury", "t"))
	require.NoError(t, s.AddMember(ctx, "treasury", "bob", "t"))

	// Same preferred name and the same verified e-mail as the local bob.
	ext := directory.External{Issuer: issuer, Subject: "other-bob", PreferredName: "bob", Email: "bob@example.com", EmailVerified: true}
	u, err := s.SignInExternal(ctx, ext)
	require.NoError(t, err)
	require.Equal(t, "bob2", u.Name)
	require.Empty(t, u.Groups)
	// Another subject with the same name gets the next one.
	u, err = s.SignInExternal(ctx, directory.External{Issuer: issuer, Subject: "third-bob", PreferredName: "bob"})
	require.NoError(t, err)
	require.Equal(t, "bob3", u.Name)
	// The same subject at another issuer is another person.
	u, err = s.SignInExternal(ctx, directory.External{Issuer: "https://other.example", Subject: "other-bob", PreferredName: "bob"})
	require.NoError(t, err)
	require.Equal(t, "bob4", u.Name)

	local, err := s.User(ctx, "bob")
	require.NoError(t, err)
	require.Equal(t, []string{"treasury"}, local.Groups)
	_, err = s.CheckPassword(ctx, "bob", "dev-password")
	require.NoError(t, err, "the local account is untouched")
}

func TestSignInExternalSyncsGroups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.New(t)
	s := directory.NewStore(db)
	for _, g := range []string{"treasury", "platform"} {
		require.NoError(t, s.CreateGroup(ctx, g, "t"))
	}
	ext := directory.External{Issuer: issuer, Subject: "s", PreferredName: "gina", SyncGroups: true, Groups: []string{"treasury", "no-such-group", "Bad Name"}}
	u, err := s.SignInExternal(ctx, ext)
	require.NoError(t, err)
	require.Equal(t, []string{"treasury"}, u.Groups, "values naming no group are ignored")

	ext.Groups = []string{"platform"}
	u, err = s.SignInExternal(ctx, ext)
	require.NoError(t, err)
	require.Equal(t, []string{"platform"}, u.Groups, "gained platform, lost treasury")

	ext.Groups = nil
	u, err = s.SignInExternal(ctx, ext)
	require.NoError(t, err)
	require.Empty(t, u.Groups)

	kinds := systemKinds(t, db)
	require.Contains(t, kinds, "group.member_added")
	require.Contains(t, kinds, "group.member_removed")

	// Without SyncGroups, memberships are the directory's to manage.
	require.NoError(t, s.AddMember(ctx, "treasury", "gina", "admin"))
	u, err = s.SignInExternal(ctx, directory.External{Issuer: issuer, Subject: "s", Groups: []string{"platform"}})
	require.NoError(t, err)
	require.Equal(t, []string{"treasury"}, u.Groups)
}

func TestSignInExternalDisabledUser(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := directory.NewStore(dbtest.New(t))
	ext := directory.External{Issuer: issuer, Subject: "s", PreferredName: "hal", DisplayName: "Hal"}
	_, err := s.SignInExternal(ctx, ext)
	require.NoError(t, err)
	require.NoError(t, s.DisableUser(ctx, "hal", "admin"))
	ext.DisplayName = "Hal 9000"
	_, err = s.SignInExternal(ctx, ext)
	require.ErrorIs(t, err, directory.ErrUserDisabled)
	u, err := s.User(ctx, "hal")
	require.NoError(t, err)
	require.Equal(t, "Hal", u.DisplayName, "nothing changes")

	_, err = s.SignInExternal(ctx, directory.External{Issuer: issuer})
	require.ErrorIs(t, err, directory.ErrBadExternal)
}

func TestNormalName(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"Alice":                 "alice",
		"alice@example.com":     "alice",
		"Jean Luc":              "jean-luc",
		"9lives":                "lives",
		"":                      "user",
		"@":                     "user",
		"日本":                    "user",
		"o'brien":               "o-brien",
		strings.Repeat("x", 70): strings.Repeat("x", 56),
	} {
		require.Equal(t, want, directory.NormalName(in), in)
		require.True(t, directory.ValidName(directory.NormalName(in)))
	}
}

func systemKinds(t *testing.T, db audit.Querier) []string {
	t.Helper()
	recs, err := audit.Chain(context.Background(), db, audit.SystemChain)
	require.NoError(t, err)
	var kinds []string
	for _, r := range recs {
		kinds = append(kinds, r.Kind)
	}
	return kinds
}
