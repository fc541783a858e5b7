package migrations_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/migrations"
)

// newestArap is the newest arap migration this binary knows.
func newestArap(t *testing.T) migrations.Migration {
	all, err := migrations.All()
	require.NoError(t, err)
	var last migrations.Migration
	for _, m := range all {
		if m.Schema == "arap" {
			last = m
		}
	}
	return last
}

// TestSchemaCompatibility, against a real database: an unmigrated one is
// refused, naming where it is, what this binary needs and what to run; a
// migrated one runs; one with a newer migration declared compatible with
// this binary runs (a rollback across an additive migration); one with a
// newer incompatible migration is refused, naming it.
func TestSchemaCompatibility(t *testing.T) {
	ctx := context.Background()
	url := dbtest.URL(t)
	pool := dbtest.New(t) // another database: for the unmigrated case
	_, err := pool.Exec(ctx, "DROP SCHEMA arap CASCADE; DROP SCHEMA pep CASCADE; DROP SCHEMA river CASCADE; DROP SCHEMA pep_river CASCADE; DROP TABLE public.arap_schema_migrations")
	require.NoError(t, err)
	err = migrations.Check(ctx, pool)
	var ie *migrations.IncompatibleError
	require.ErrorAs(t, err, &ie)
	require.Contains(t, err.Error(), "schema arap is not migrated: the database is at version 0000, this binary needs "+pad(newestArap(t).Version))
	require.Contains(t, err.Error(), "run `arapd migrate` (or start with --migrate)")
	require.Contains(t, err.Error(), "schema river is not migrated")

	// A database missing only the newest migration is as unmigrated.
	last := newestArap(t)
	db, err := migrations.Open(ctx, url, false, nil)
	require.NoError(t, err, "a migrated database runs")
	defer db.Close()
	_, err = db.Exec(ctx, "DELETE FROM public.arap_schema_migrations WHERE schema = 'arap' AND version = $1", last.Version)
	require.NoError(t, err)
	err = migrations.Check(ctx, db)
	require.ErrorContains(t, err, "schema arap is not migrated")
	require.ErrorContains(t, err, "missing "+label(last))
	_, err = migrations.Open(ctx, url, false, nil)
	require.ErrorContains(t, err, "schema arap is not migrated", "Open refuses it too")
	_, err = db.Exec(ctx, "INSERT INTO public.arap_schema_migrations (schema, version, name, compatible_with) VALUES ('arap', $1, $2, $1)", last.Version, last.Name)
	require.NoError(t, err)
	require.NoError(t, migrations.Check(ctx, db))

	// A newer migration (a later binary's) declared compatible with this one.
	next := last.Version + 1
	_, err = db.Exec(ctx, "INSERT INTO public.arap_schema_migrations (schema, version, name, compatible_with) VALUES ('arap', $1, 'additive_future', $2)", next, last.Version)
	require.NoError(t, err)
	require.NoError(t, migrations.Check(ctx, db), "a newer migration compatible with this binary")
	p, err := migrations.Open(ctx, url, false, nil)
	require.NoError(t, err)
	p.Close()

	// One that is not: refused, with the message. It needs a binary
	// knowing the migration just after this binary's newest: the boundary.
	_, err = db.Exec(ctx, "INSERT INTO public.arap_schema_migrations (schema, version, name, compatible_with) VALUES ('arap', $1, 'breaking_future', $2)", next+1, next)
	require.NoError(t, err)
	err = migrations.Check(ctx, db)
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "database schema: schema arap is newer than this binary: the database has "+pad(next+1)+"_breaking_future, which needs a binary knowing at least "+pad(next)+
		", and this binary knows up to "+pad(last.Version)+"; run the newer arapd (or `arapd migrate --status` with it)", err.Error())
	_, err = migrations.Open(ctx, url, false, nil)
	require.ErrorAs(t, err, &ie, "Open refuses it too")

	var b strings.Builder
	st, err := migrations.Status(ctx, db)
	require.NoError(t, err)
	require.NoError(t, migrations.WriteStatus(&b, st))
	out := b.String()
	require.Contains(t, out, "schema arap: database at "+pad(next+1)+", this binary knows up to "+pad(last.Version)+"\n")
	require.Contains(t, out, "  "+label(last)+"  applied\n")
	require.Contains(t, out, "  "+pad(next)+"_additive_future  applied, unknown to this binary (compatible with binaries knowing "+pad(last.Version)+" or later)\n")
	require.Contains(t, out, "  cannot run: schema arap is newer than this binary")
	require.Contains(t, out, "schema river: database at ")
	require.Contains(t, out, "schema pep_river: database at ")
	require.True(t, strings.HasSuffix(out, "this binary cannot run against the database\n"), out)
}

// TestStatusPending: migrate --status lists a pending migration as such and
// says this binary can run once it is applied.
func TestStatusPending(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	var b strings.Builder
	st, err := migrations.Status(ctx, db)
	require.NoError(t, err)
	require.NoError(t, migrations.WriteStatus(&b, st))
	require.True(t, strings.HasSuffix(b.String(), "\nthis binary can run against the database\n"), b.String())
	require.Contains(t, b.String(), "schema pep: database at ")

	last := newestArap(t)
	_, err = db.Exec(ctx, "DELETE FROM public.arap_schema_migrations WHERE schema = 'arap' AND version = $1", last.Version)
	require.NoError(t, err)
	st, err = migrations.Status(ctx, db)
	require.NoError(t, err)
	b.Reset()
	require.NoError(t, migrations.WriteStatus(&b, st))
	require.Contains(t, b.String(), "  "+label(last)+"  pending\n")
	require.True(t, strings.HasSuffix(b.String(), "this binary cannot run against the database\n"), b.String())
}

// TestUpRecordsCompatibility: the declaration is written to the
// bookkeeping table as each migration is applied, for older binaries.
func TestUpRecordsCompatibility(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	_, err := db.Exec(ctx, "DROP SCHEMA arap CASCADE; DROP SCHEMA pep CASCADE; DROP SCHEMA river CASCADE; DROP SCHEMA pep_river CASCADE; DROP TABLE public.arap_schema_migrations")
	require.NoError(t, err)
	require.NoError(t, migrations.Up(ctx, db, nil))
	all, err := migrations.All()
	require.NoError(t, err)
	for _, m := range all {
		var got *int
		require.NoError(t, db.QueryRow(ctx, "SELECT compatible_with FROM public.arap_schema_migrations WHERE schema = $1 AND version = $2", m.Schema, m.Version).Scan(&got))
		require.NotNil(t, got, "%s/%d", m.Schema, m.Version)
		require.Equal(t, m.CompatibleWith, *got, "%s/%d", m.Schema, m.Version)
	}
}

func pad(n int) string                    { return fmt.Sprintf("%04d", n) }
func label(m migrations.Migration) string { return pad(m.Version) + "_" + m.Name }

// TestCompatibleWithHeader: the declaration is read from the leading
// comment only, and a bad one is an error naming the file.
func TestCompatibleWithHeader(t *testing.T) {
	require.Equal(t, 17, migrations.CompatibleWith("-- Adds a column.\n-- compatible-with: 0017\nALTER TABLE x ADD COLUMN y int;\n", 18))
	require.Equal(t, 18, migrations.CompatibleWith("-- Drops a column.\nALTER TABLE x DROP COLUMN y;\n-- compatible-with: 0017\n", 18), "not in the leading comment")
	require.Equal(t, 18, migrations.CompatibleWith("ALTER TABLE x DROP COLUMN y;\n", 18))
}

func TestCompatibleWithBadHeader(t *testing.T) {
	require.Equal(t, -1, migrations.CompatibleWith("-- compatible-with: 0019\n", 18), "later than itself")
	require.Equal(t, -1, migrations.CompatibleWith("-- compatible-with: soon\n", 18))
}
