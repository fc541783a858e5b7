package migrations_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/migrations"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func TestUpIsIdempotentAndConcurrentSafe(t *testing.T) {
	ctx := context.Background()
	url := dbtest.URL(t)
	// The template is already migrated; running Up again from several
	// "replicas" at once must change nothing and fail nowhere.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pool, err := pgxpool.New(ctx, url)
			if err != nil {
				errs[i] = err
				return
			}
			defer pool.Close()
			errs[i] = migrations.Up(ctx, pool, nil)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	pool := dbtest.New(t)
	all, err := migrations.All()
	require.NoError(t, err)
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM public.arap_schema_migrations").Scan(&n))
	require.Equal(t, len(all), n)
	var riverTables int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'river' AND table_name = 'river_job'").Scan(&riverTables))
	require.Equal(t, 1, riverTables)
}

func TestFreshDatabaseMigratesFromScratch(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.New(t)
	_, err := pool.Exec(ctx, "DROP SCHEMA arap CASCADE; DROP SCHEMA pep CASCADE; DROP SCHEMA river CASCADE; DROP SCHEMA pep_river CASCADE; DROP TABLE public.arap_schema_migrations")
	require.NoError(t, err)
	require.NoError(t, migrations.Up(ctx, pool, nil))
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM arap.requests").Scan(&n))
	require.Zero(t, n)
}
