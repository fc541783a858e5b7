package dbdown_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbdown"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/pgembed"
)

// TestReadOnly: a hot standby's refusals (a write, LISTEN, NOTIFY, a
// sequence, a transaction id) are unavailability that sent nothing (a
// retry cannot apply twice); its reads are not errors, and a primary's
// serialization failure is not a standby's conflict with recovery.
func TestReadOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.NewReplicated(t)
	primary, err := pgxpool.New(ctx, db.URL)
	require.NoError(t, err)
	defer primary.Close()
	_, err = primary.Exec(ctx, `CREATE TABLE u (k int PRIMARY KEY); CREATE SEQUENCE s`)
	require.NoError(t, err)
	_, url := db.Standby(t, pgembed.StandbyOptions{})
	standby, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer standby.Close()

	require.Eventually(t, func() bool {
		_, err := standby.Exec(ctx, `SELECT count(*) FROM u`)
		return err == nil
	}, 30*time.Second, 20*time.Millisecond, "the standby has the table")
	for _, sql := range []string{
		`INSERT INTO u VALUES (1)`,
		`BEGIN; SELECT 1; INSERT INTO u VALUES (1); COMMIT`,
		`LISTEN c`,
		`NOTIFY c`,
		`SELECT pg_notify('c', 'x')`,
		`SELECT nextval('s')`,
		`SELECT k FROM u FOR UPDATE`,
		`SELECT pg_current_xact_id()`,
	} {
		_, err := standby.Exec(ctx, sql)
		require.Error(t, err, sql)
		require.True(t, dbdown.Is(err), "%s: %v", sql, err)
		require.True(t, dbdown.ReadOnly(err), "%s: %v", sql, err)
		require.True(t, dbdown.NotSent(err), "%s: %v", sql, err)
	}
	_, err = standby.Exec(ctx, `SELECT count(*) FROM u`)
	require.NoError(t, err)
	_, err = standby.Exec(ctx, `SELEKT 1`)
	require.False(t, dbdown.Is(err), "a syntax error is not an outage on a standby either")

	// A readiness check's refusal, wrapped.
	wrapped := fmt.Errorf("database: %w", dbdown.ErrReadOnly)
	require.True(t, dbdown.Is(wrapped))
	require.True(t, dbdown.NotSent(wrapped))

	// 40001 counts only as a standby's conflict with recovery.
	conflict := &pgconn.PgError{Code: "40001", Message: "canceling statement due to conflict with recovery"}
	require.True(t, dbdown.Is(conflict))
	require.True(t, dbdown.NotSent(conflict))
	serial := &pgconn.PgError{Code: "40001", Message: "could not serialize access due to concurrent update"}
	require.False(t, dbdown.Is(serial))
	require.False(t, dbdown.NotSent(serial))
	require.False(t, dbdown.Is(&pgconn.PgError{Code: "XX000", Message: "cache lookup failed"}))
}
