package migrations

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// compatHeader starts the line of a migration's leading comment that
// declares the oldest binary still running against it.
const compatHeader = "-- compatible-with:"

// compatibleWith reads the "-- compatible-with: NNNN" line of a migration's
// leading comment; without one, a migration is compatible only with
// binaries that know it.
func compatibleWith(sql string, version int) (int, error) {
	for line := range strings.Lines(sql) {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if !strings.HasPrefix(line, "--") {
			break // the leading comment is over
		}
		v, ok := strings.CutPrefix(line, compatHeader)
		if !ok {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 1 || n > version {
			return 0, fmt.Errorf("%s %q: want the version (at most %d) of the oldest migration set still compatible", compatHeader, strings.TrimSpace(v), version)
		}
		return n, nil
	}
	return version, nil
}

// Applied is a migration recorded in the database.
type Applied struct {
	Version        int
	Name           string
	CompatibleWith int // for River's, the version itself
	AppliedAt      time.Time
}

// SchemaStatus is one schema's migrations: those this binary knows and
// those the database has, and why this binary cannot run against it
// ("" when it can).
type SchemaStatus struct {
	Schema  string
	Known   []Migration // this binary's; for River's schemas only Version and Name
	Applied []Applied
	Problem string
}

// Newest is the newest migration this binary knows.
func (s SchemaStatus) Newest() int {
	if len(s.Known) == 0 {
		return 0
	}
	return s.Known[len(s.Known)-1].Version
}

// Pending are the known migrations the database lacks.
func (s SchemaStatus) Pending() []Migration {
	have := map[int]bool{}
	for _, a := range s.Applied {
		have[a.Version] = true
	}
	var out []Migration
	for _, m := range s.Known {
		if !have[m.Version] {
			out = append(out, m)
		}
	}
	return out
}

// At is the newest migration the database has.
func (s SchemaStatus) At() int {
	if len(s.Applied) == 0 {
		return 0
	}
	return s.Applied[len(s.Applied)-1].Version
}

// IncompatibleError is a database schema this binary must not run against.
type IncompatibleError struct{ Problems []string }

func (e *IncompatibleError) Error() string {
	return "database schema: " + strings.Join(e.Problems, "; ")
}

// Check refuses a database this binary cannot run against: one lacking a
// migration this binary knows (unmigrated), or holding a newer one that
// declares itself incompatible with this binary (a rollback across an
// incompatible migration). A newer migration declared compatible (an
// additive one) is fine, so rolling back across it works.
func Check(ctx context.Context, pool *pgxpool.Pool) error {
	st, err := Status(ctx, pool)
	if err != nil {
		return err
	}
	var problems []string
	for _, s := range st {
		if s.Problem != "" {
			problems = append(problems, s.Problem)
		}
	}
	if problems != nil {
		return &IncompatibleError{Problems: problems}
	}
	return nil
}

// WriteStatus prints st for a person: per schema, each migration applied
// or pending, and whether this binary can run against the database.
func WriteStatus(w io.Writer, st []SchemaStatus) error {
	var b strings.Builder
	ok := true
	for _, s := range st {
		fmt.Fprintf(&b, "schema %s: database at %04d, this binary knows up to %04d\n", s.Schema, s.At(), s.Newest())
		known := map[int]bool{}
		for _, m := range s.Known {
			known[m.Version] = true
		}
		pending := map[int]bool{}
		for _, m := range s.Pending() {
			pending[m.Version] = true
		}
		for _, m := range s.Known {
			state := "pending"
			if !pending[m.Version] {
				state = "applied"
			}
			fmt.Fprintf(&b, "  %s  %s\n", label(m.Version, m.Name), state)
		}
		for _, a := range s.Applied {
			if !known[a.Version] {
				fmt.Fprintf(&b, "  %s  applied, unknown to this binary (compatible with binaries knowing %04d or later)\n", label(a.Version, a.Name), a.CompatibleWith)
			}
		}
		if s.Problem != "" {
			ok = false
			fmt.Fprintf(&b, "  cannot run: %s\n", s.Problem)
		}
	}
	if ok {
		b.WriteString("this binary can run against the database\n")
	} else {
		b.WriteString("this binary cannot run against the database\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func label(version int, name string) string {
	if name == "" {
		return fmt.Sprintf("%04d", version)
	}
	return fmt.Sprintf("%04d_%s", version, name)
}

// Status reads every schema's migrations (ours, then River's) and judges
// whether this binary can run against them.
func Status(ctx context.Context, pool *pgxpool.Pool) ([]SchemaStatus, error) {
	all, err := All()
	if err != nil {
		return nil, err
	}
	var table *string
	if err := pool.QueryRow(ctx, `SELECT to_regclass('public.arap_schema_migrations')::text`).Scan(&table); err != nil {
		return nil, fmt.Errorf("migrations: status: %w", err)
	}
	applied := map[string][]Applied{}
	if table != nil {
		// compatible_with is NULL for rows written before it was recorded:
		// those migrations are compatible with themselves only.
		rows, err := pool.Query(ctx, `SELECT schema, version, name, coalesce(compatible_with, version), applied_at
			FROM public.arap_schema_migrations ORDER BY schema, version`)
		if err != nil {
			return nil, fmt.Errorf("migrations: status: %w", err)
		}
		for rows.Next() {
			var schema string
			var a Applied
			if err := rows.Scan(&schema, &a.Version, &a.Name, &a.CompatibleWith, &a.AppliedAt); err != nil {
				rows.Close()
				return nil, fmt.Errorf("migrations: status: %w", err)
			}
			applied[schema] = append(applied[schema], a)
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("migrations: status: %w", err)
		}
	}
	var out []SchemaStatus
	for _, schema := range Schemas {
		s := SchemaStatus{Schema: schema, Applied: applied[schema]}
		for _, m := range all {
			if m.Schema == schema {
				s.Known = append(s.Known, m)
			}
		}
		s.Problem = judge(s)
		out = append(out, s)
	}
	for _, schema := range []string{RiverSchema, PEPRiverSchema} {
		s, err := riverStatus(ctx, pool, schema)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// judge says why this binary cannot run against s, or "".
func judge(s SchemaStatus) string {
	n := s.Newest()
	if pending := s.Pending(); len(pending) > 0 {
		return fmt.Sprintf("schema %s is not migrated: the database is at version %04d, this binary needs %04d (missing %s); run `arapd migrate` (or start with --migrate)",
			s.Schema, s.At(), n, names(pending))
	}
	for _, a := range s.Applied {
		if a.Version > n && a.CompatibleWith > n {
			return fmt.Sprintf("schema %s is newer than this binary: the database has %04d_%s, which needs a binary knowing at least %04d, and this binary knows up to %04d; run the newer arapd (or `arapd migrate --status` with it)",
				s.Schema, a.Version, a.Name, a.CompatibleWith, n)
		}
	}
	return ""
}

func names(ms []Migration) string {
	var out []string
	for _, m := range ms {
		if m.Name != "" {
			out = append(out, fmt.Sprintf("%04d_%s", m.Version, m.Name))
		} else {
			out = append(out, fmt.Sprintf("%04d", m.Version))
		}
	}
	if len(out) > 5 {
		out = append(out[:5], fmt.Sprintf("and %d more", len(out)-5))
	}
	return strings.Join(out, ", ")
}

// riverStatus reads River's migrations in schema. River's migrations
// declare no compatibility: a newer one than this binary's River knows is
// refused.
func riverStatus(ctx context.Context, pool *pgxpool.Pool, schema string) (SchemaStatus, error) {
	s := SchemaStatus{Schema: schema}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: schema})
	if err != nil {
		return s, fmt.Errorf("migrations: river migrator: %w", err)
	}
	for _, m := range migrator.AllVersions() {
		s.Known = append(s.Known, Migration{Schema: schema, Version: m.Version, Name: strings.ReplaceAll(m.Name, " ", "_")})
	}
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{schema, "river_migration"}.Sanitize()).Scan(&exists); err != nil {
		return s, fmt.Errorf("migrations: status of %s: %w", schema, err)
	}
	if exists {
		// Read directly rather than through ExistingVersions, which fails
		// on a version its bundle lacks: exactly the newer database a
		// status must describe.
		rows, err := pool.Query(ctx, `SELECT version, created_at FROM `+pgx.Identifier{schema, "river_migration"}.Sanitize()+
			` WHERE line = 'main' ORDER BY version`)
		if err != nil {
			return s, fmt.Errorf("migrations: status of %s: %w", schema, err)
		}
		known := map[int]string{}
		for _, m := range s.Known {
			known[m.Version] = m.Name
		}
		for rows.Next() {
			var a Applied
			if err := rows.Scan(&a.Version, &a.AppliedAt); err != nil {
				rows.Close()
				return s, fmt.Errorf("migrations: status of %s: %w", schema, err)
			}
			a.Name, a.CompatibleWith = known[a.Version], a.Version
			s.Applied = append(s.Applied, a)
		}
		if err := rows.Err(); err != nil {
			return s, fmt.Errorf("migrations: status of %s: %w", schema, err)
		}
	}
	s.Problem = judge(s)
	return s, nil
}
