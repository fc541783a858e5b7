package durability_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/durability"
	"github.com/omcp/arap/internal/pgembed"
)

func check(t *testing.T, db durability.Querier) durability.Report {
	t.Helper()
	r, err := durability.Check(context.Background(), db)
	require.NoError(t, err)
	return r
}

func pool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// TestStandbys walks one primary from a single server to an asynchronous
// standby to a synchronous one, and reads each report, with the session
// settings that undo a synchronous standby, from a standby, and as a role
// that may not see pg_stat_replication.
func TestStandbys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.NewReplicated(t)
	primary := pool(t, db.URL)

	// A single server that can have standbys: a failover could lose.
	r := check(t, primary)
	require.False(t, r.ReadOnly)
	require.Equal(t, "on", r.SynchronousCommit)
	require.False(t, r.SynchronousStandby)
	require.True(t, r.Replication)
	require.Equal(t, &durability.Standbys{}, r.Standbys)
	require.Contains(t, r.Warning, "no synchronous standby is configured")

	// An asynchronous standby: the same risk, now real.
	_, standbyURL := db.Standby(t, pgembed.StandbyOptions{Name: "async_one"})
	r = check(t, primary)
	require.Equal(t, &durability.Standbys{Asynchronous: 1}, r.Standbys)
	require.Contains(t, r.Warning, "no synchronous standby is configured")
	require.Contains(t, r.Summary(), "standbys streaming: 0 synchronous, 0 potential, 1 asynchronous")

	// The standby itself: read-only, and its settings say nothing yet.
	r = check(t, pool(t, standbyURL))
	require.True(t, r.InRecovery)
	require.True(t, r.ReadOnly)
	require.Empty(t, r.Warning)
	require.True(t, strings.HasPrefix(r.Summary(), "in recovery (a standby): read-only"), r.Summary())

	// A synchronous standby: nothing acknowledged is lost.
	db.Standby(t, pgembed.StandbyOptions{Name: "sync_one", Synchronous: true})
	r = check(t, primary)
	require.True(t, r.SynchronousStandby)
	require.Equal(t, &durability.Standbys{Synchronous: 1, Asynchronous: 1}, r.Standbys)
	require.Empty(t, r.Warning, r.Summary())

	// What the sessions run with decides: a URL's, a role's setting.
	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	for value, warning := range map[string]string{
		"local": "synchronous_commit is local", "off": "synchronous_commit is off",
		"remote_write": "", "remote_apply": "", "on": "",
	} {
		_, err := conn.Exec(ctx, "SET synchronous_commit = "+value)
		require.NoError(t, err)
		r, err := durability.Check(ctx, conn)
		require.NoError(t, err)
		require.Equal(t, value, r.SynchronousCommit)
		if warning == "" {
			require.Empty(t, r.Warning, value)
		} else {
			require.Contains(t, r.Warning, warning)
		}
	}
	r = check(t, pool(t, db.URL+"&synchronous_commit=local"))
	require.Equal(t, "local", r.SynchronousCommit, "a runtime parameter in the URL")
	require.Contains(t, r.Warning, "synchronous_commit is local")

	// A role without pg_monitor sees standbys but not their state.
	_, err = conn.Exec(ctx, "CREATE ROLE plain LOGIN")
	require.NoError(t, err)
	plainURL := strings.Replace(db.URL, "postgres@", "plain@", 1)
	r = check(t, pool(t, plainURL))
	require.Nil(t, r.Standbys)
	require.Contains(t, r.Summary(), "standbys unknown (pg_stat_replication needs pg_monitor)")
	require.Empty(t, r.Warning, "the rule does not need to see them")
	_, err = conn.Exec(ctx, "GRANT pg_monitor TO plain")
	require.NoError(t, err)
	r = check(t, pool(t, plainURL))
	require.Equal(t, &durability.Standbys{Synchronous: 1, Asynchronous: 1}, r.Standbys)
}

// TestNoReplication: a server that cannot have standbys (wal_level
// minimal) has no failover to lose claims in; with synchronous_commit off
// a crash still can.
func TestNoReplication(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := pgembed.Start(ctx, pgembed.Options{Ephemeral: true,
		Settings: []string{"wal_level=minimal", "max_wal_senders=0", "synchronous_commit=on"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop(ctx) })
	p := pool(t, c.ConnString("postgres"))
	r := check(t, p)
	require.False(t, r.Replication)
	require.Empty(t, r.Warning, r.Summary())

	_, err = p.Exec(ctx, "ALTER ROLE postgres SET synchronous_commit = off")
	require.NoError(t, err)
	r = check(t, pool(t, c.ConnString("postgres")))
	require.Equal(t, "off", r.SynchronousCommit)
	require.Contains(t, r.Warning, "a crash or a failover can lose the last ones")
}

// TestLog: at warn level with the warning when at risk, else at info.
func TestLog(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	log := slog.New(slog.NewTextHandler(&b, nil))
	durability.Log(context.Background(), log, durability.Report{SynchronousCommit: "on", SynchronousStandby: true,
		Standbys: &durability.Standbys{Synchronous: 1}})
	require.Contains(t, b.String(), "level=INFO msg=\"database durability\"")
	b.Reset()
	durability.Log(context.Background(), log, durability.Report{SynchronousCommit: "off", Warning: "synchronous_commit is off"})
	require.Contains(t, b.String(), "level=WARN msg=\"database durability: a failover could lose an execution claim\"")
	require.Contains(t, b.String(), "warning=\"synchronous_commit is off\"")
}
