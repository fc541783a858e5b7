package requests_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/migrations"
	"github.com/omcp/arap/requests"
)

// keysAsTables puts f's database back in the shape before migration 0022
// (arap/0022_submission_keys): each request's Idempotency-Key and spent jti
// as rows of arap.idempotency_keys and arap.binding_jtis, as an earlier
// version wrote them, and no such columns on arap.requests.
func keysAsTables(t *testing.T, f *fixture) {
	t.Helper()
	_, err := f.db.Exec(context.Background(), `
		CREATE TABLE arap.idempotency_keys (
			client_id  text NOT NULL REFERENCES arap.api_clients (id),
			key        text NOT NULL,
			body_hash  bytea NOT NULL,
			request_id text NOT NULL REFERENCES arap.requests (id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
			created_at timestamptz NOT NULL,
			PRIMARY KEY (client_id, key));
		CREATE TABLE arap.binding_jtis (jti text PRIMARY KEY, expires_at timestamptz NOT NULL, request_id text NOT NULL);
		CREATE INDEX binding_jtis_expires ON arap.binding_jtis (expires_at);
		INSERT INTO arap.idempotency_keys SELECT client_id, idempotency_key, idempotency_hash, id, created_at
			FROM arap.requests WHERE idempotency_key IS NOT NULL;
		INSERT INTO arap.binding_jtis SELECT binding_jti, created_at + interval '10 minutes', id
			FROM arap.requests WHERE binding_jti IS NOT NULL;
		ALTER TABLE arap.requests DROP COLUMN idempotency_key, DROP COLUMN idempotency_hash, DROP COLUMN binding_jti;
		DELETE FROM public.arap_schema_migrations WHERE schema = 'arap' AND version >= 22`)
	require.NoError(t, err)
}

// TestKeysSubmittedBeforeMigration: a key and a jti an earlier version
// recorded (as rows of their own) still answer after migration 0022 moves
// them onto the request row: the same body under the key replays the
// handle, a different one is duplicate_request, and the token under another
// key is a jti replay. The old tables are gone.
func TestKeysSubmittedBeforeMigration(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	raw := f.fresh("wire_transfer", map[string]any{"to": "a", "amount": 50000})
	first, err := f.svc.Submit(ctx, f.pep, "before", raw)
	require.NoError(t, err)
	keyless := f.fresh("wire_transfer", map[string]any{"to": "b", "amount": 50000})
	_, err = f.svc.Submit(ctx, f.pep, "", keyless)
	require.NoError(t, err)

	keysAsTables(t, f)
	require.Equal(t, 1, count(t, f, "arap.idempotency_keys"))
	require.Equal(t, 2, count(t, f, "arap.binding_jtis"))
	require.NoError(t, migrations.Up(ctx, f.db, nil))
	var gone bool
	require.NoError(t, f.db.QueryRow(ctx, `SELECT to_regclass('arap.idempotency_keys') IS NULL AND to_regclass('arap.binding_jtis') IS NULL`).Scan(&gone))
	require.True(t, gone, "the old tables are dropped")
	require.Equal(t, 1, count(t, f, "arap.requests WHERE idempotency_key = 'before' AND idempotency_hash IS NOT NULL"))
	require.Equal(t, 2, count(t, f, "arap.requests WHERE binding_jti IS NOT NULL"))

	again, err := f.svc.Submit(ctx, f.pep, "before", raw)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, first.Request.ID, again.Request.ID)
	_, err = f.svc.Submit(ctx, f.pep, "before", patch(raw, "context", map[string]any{"tenant": "acme", "note": "other"}))
	require.Equal(t, authzen.ProblemDuplicateRequest, requests.ErrorCode(err), "%v", err)
	for _, body := range [][]byte{raw, keyless} {
		_, err = f.svc.Submit(ctx, f.pep, "after", body)
		require.Equal(t, authzen.ProblemInvalidDenialBinding, requests.ErrorCode(err), "%v", err)
		require.ErrorContains(t, err, "jti replay")
	}
	require.Equal(t, 2, count(t, f, "arap.requests"))
}
