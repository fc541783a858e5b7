package migrations_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/migrations"
)

// TestSubmissionKeysBackfill: arap/0022 moves each Idempotency-Key (scoped
// to its client, with its body hash) and each spent jti onto its request,
// drops the old tables, and from then on the request's unique indexes
// refuse a second holder of a key within a client and of a jti anywhere.
// The requests package checks the same through Submit
// (requests.TestKeysSubmittedBeforeMigration).
func TestSubmissionKeysBackfill(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	// The schema before 0022, with what an earlier version wrote into it.
	_, err := db.Exec(ctx, `
		ALTER TABLE arap.requests DROP COLUMN idempotency_key, DROP COLUMN idempotency_hash, DROP COLUMN binding_jti;
		DELETE FROM public.arap_schema_migrations WHERE schema = 'arap' AND version >= 22;
		CREATE TABLE arap.idempotency_keys (
			client_id  text NOT NULL REFERENCES arap.api_clients (id),
			key        text NOT NULL,
			body_hash  bytea NOT NULL,
			request_id text NOT NULL REFERENCES arap.requests (id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
			created_at timestamptz NOT NULL,
			PRIMARY KEY (client_id, key));
		CREATE TABLE arap.binding_jtis (jti text PRIMARY KEY, expires_at timestamptz NOT NULL, request_id text NOT NULL);
		INSERT INTO arap.api_clients (id, name, token_hash, scopes, resolver_kind, created_at) VALUES
			('c1', 'one', 'h1', '{request}', 'automation', now()), ('c2', 'two', 'h2', '{request}', 'automation', now());
		INSERT INTO arap.requests (id, client_id, status, rule, subject, resource, action, denial, evaluation_id,
			binding_hash, binding_context_members, expires_at, created_at, updated_at, terminal_at)
		SELECT id, client, status, 'r', '{}', '{}', '{}', '{}', 'e', 'h', '{}', now(), now(), now(), CASE WHEN status = 'pending' THEN NULL ELSE now() END
		FROM (VALUES ('r1', 'c1', 'pending'), ('r2', 'c2', 'pending'), ('r3', 'c1', 'denied'), ('r4', 'c1', 'cancelled'), ('r5', 'c1', 'pending')) v (id, client, status);
		INSERT INTO arap.idempotency_keys VALUES
			('c1', 'k', '\x01', 'r1', now()), ('c2', 'k', '\x02', 'r2', now()), ('c1', 'k3', '\x03', 'r3', now());
		INSERT INTO arap.binding_jtis VALUES
			('j1', now(), 'r1'), ('j2', now(), 'r2'), ('j4', now(), 'r4')`)
	require.NoError(t, err)

	require.NoError(t, migrations.Up(ctx, db, nil))
	rows, err := db.Query(ctx, `SELECT id, coalesce(idempotency_key, '-'), coalesce(encode(idempotency_hash, 'hex'), '-'), coalesce(binding_jti, '-')
		FROM arap.requests ORDER BY id`)
	require.NoError(t, err)
	var got [][4]string
	for rows.Next() {
		var r [4]string
		require.NoError(t, rows.Scan(&r[0], &r[1], &r[2], &r[3]))
		got = append(got, r)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, [][4]string{
		{"r1", "k", "01", "j1"},
		{"r2", "k", "02", "j2"}, // the same key, another client's
		{"r3", "k3", "03", "-"}, // a key whose jti was purged
		{"r4", "-", "-", "j4"},  // a jti without a key
		{"r5", "-", "-", "-"},
	}, got)
	var gone bool
	require.NoError(t, db.QueryRow(ctx, `SELECT to_regclass('arap.idempotency_keys') IS NULL AND to_regclass('arap.binding_jtis') IS NULL`).Scan(&gone))
	require.True(t, gone)

	unique := func(sql, index string) {
		t.Helper()
		_, err := db.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, sql)
		require.Equal(t, "23505", pgErr.Code)
		require.Equal(t, index, pgErr.ConstraintName)
	}
	unique(`UPDATE arap.requests SET idempotency_key = 'k', idempotency_hash = '\x05' WHERE id = 'r5'`, "requests_idempotency_key")
	unique(`UPDATE arap.requests SET binding_jti = 'j2' WHERE id = 'r5'`, "requests_binding_jti")
	_, err = db.Exec(ctx, `UPDATE arap.requests SET idempotency_key = 'k2', idempotency_hash = '\x05' WHERE id = 'r5'`)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `UPDATE arap.requests SET idempotency_key = 'k' WHERE id = 'r4'`)
	require.ErrorContains(t, err, "requests_idempotency_hash", "a key always has its body's hash")
}
