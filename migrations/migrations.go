// Package migrations applies the database schema: our embedded SQL files, one
// directory per schema (arap for the backend, pep for the MCP front-end), and
// River's own migrations through rivermigrate. Migrate is safe to run from
// several replicas at once: an advisory lock serializes them.
package migrations

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/omcp/arap/internal/logs"
)

//go:embed */*.sql
var files embed.FS

// RiverSchema is the schema of the backend's River tables; PEPRiverSchema
// the MCP front-end's. Each party has its own queue tables and its own
// leader, as two services would (River runs a schema's periodic jobs on its
// leader only).
const (
	RiverSchema    = "river"
	PEPRiverSchema = "pep_river"
)

// Schemas lists our schemas in the order they are migrated.
var Schemas = []string{"arap", "pep"}

// lockKey is an arbitrary constant for pg_advisory_lock.
const lockKey = 0x61726170 // "arap"

// Migration is one embedded SQL file.
type Migration struct {
	Schema  string
	Version int
	Name    string
	SQL     string
	// CompatibleWith is the oldest binary, by the newest migration it
	// knows, that still runs against a database with this migration: a
	// "-- compatible-with: NNNN" line in the file's leading comment. Without
	// one it is the migration's own version (only binaries that know it).
	CompatibleWith int
}

// All returns every embedded migration, ordered by schema then version.
func All() ([]Migration, error) {
	var out []Migration
	for _, schema := range Schemas {
		entries, err := fs.ReadDir(files, schema)
		if err != nil {
			return nil, fmt.Errorf("migrations: read %s: %w", schema, err)
		}
		var ms []Migration
		for _, e := range entries {
			name := e.Name()
			num, rest, ok := strings.Cut(name, "_")
			v, err := strconv.Atoi(num)
			if !ok || err != nil || !strings.HasSuffix(name, ".sql") {
				return nil, fmt.Errorf("migrations: %s/%s: want NNNN_name.sql", schema, name)
			}
			body, err := files.ReadFile(path.Join(schema, name))
			if err != nil {
				return nil, err
			}
			compat, err := compatibleWith(string(body), v)
			if err != nil {
				return nil, fmt.Errorf("migrations: %s/%s: %w", schema, name, err)
			}
			ms = append(ms, Migration{Schema: schema, Version: v, Name: strings.TrimSuffix(rest, ".sql"), SQL: string(body), CompatibleWith: compat})
		}
		sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
		for i, m := range ms {
			if m.Version != i+1 {
				return nil, fmt.Errorf("migrations: %s: version %d out of sequence", schema, m.Version)
			}
		}
		out = append(out, ms...)
	}
	return out, nil
}

// Up applies every pending migration, ours and River's.
func Up(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	all, err := All()
	if err != nil {
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("migrations: acquire: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", lockKey); err != nil {
		return fmt.Errorf("migrations: lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lockKey) //nolint:errcheck

	for _, s := range append([]string{RiverSchema, PEPRiverSchema}, Schemas...) {
		if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{s}.Sanitize()); err != nil {
			return fmt.Errorf("migrations: create schema %s: %w", s, err)
		}
	}
	// compatible_with is recorded as each migration is applied, so that an
	// older binary, which lacks the file, can still read what it declared.
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS public.arap_schema_migrations (
		schema text NOT NULL, version int NOT NULL, name text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (schema, version));
		ALTER TABLE public.arap_schema_migrations ADD COLUMN IF NOT EXISTS compatible_with int`); err != nil {
		return fmt.Errorf("migrations: bookkeeping table: %w", err)
	}
	for _, m := range all {
		var done bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM public.arap_schema_migrations WHERE schema = $1 AND version = $2)`,
			m.Schema, m.Version).Scan(&done); err != nil {
			return fmt.Errorf("migrations: check %s/%d: %w", m.Schema, m.Version, err)
		}
		if done {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO public.arap_schema_migrations (schema, version, name, compatible_with) VALUES ($1, $2, $3, $4)`,
				m.Schema, m.Version, m.Name, m.CompatibleWith)
			return err
		})
		if err != nil {
			return fmt.Errorf("migrations: apply %s/%04d_%s: %w", m.Schema, m.Version, m.Name, err)
		}
		log.Info("migration applied", "schema", m.Schema, "version", m.Version, "name", m.Name)
	}

	for _, schema := range []string{RiverSchema, PEPRiverSchema} {
		migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: schema, Logger: logs.Quiet(log, slog.LevelWarn)})
		if err != nil {
			return fmt.Errorf("migrations: river migrator: %w", err)
		}
		res, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
		if err != nil {
			return fmt.Errorf("migrations: river (%s): %w", schema, err)
		}
		if len(res.Versions) > 0 {
			log.Info("river migrations applied", "schema", schema, "from", res.Versions[0].Version, "to", res.Versions[len(res.Versions)-1].Version)
		}
	}
	return nil
}

// MinConns is the least a server process's pool holds: pgx's default (4 on
// two cores) queued concurrent requests behind each other's transactions
// (arapbench). pool_max_conns in the URL still wins when it asks for more.
const MinConns = 20

// Open connects a server process (arapd serve, arapd mcp) to its database:
// a pool of at least MinConns, checked with a ping, migrated first if
// migrate is set, and refused (Check) when its schema is one this binary
// cannot run against.
func Open(ctx context.Context, databaseURL string, migrate bool, log *slog.Logger) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	cfg.MaxConns = max(cfg.MaxConns, MinConns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	if migrate {
		if err := Up(ctx, pool, log); err != nil {
			pool.Close()
			return nil, err
		}
	}
	if err := Check(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}
