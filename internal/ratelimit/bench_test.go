package ratelimit_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/ratelimit"
)

// BenchmarkTake measures one Take against real PostgreSQL, from parallel
// goroutines as a busy replica would: all on one key (one API client, one
// hot row: the evaluation path) or each on its own key, with a statement per
// request (batch 1, as for limits below 200) or in batches of 100 (limits
// of 10,000 and more). select-1 is the floor: a round trip that does
// nothing. The pool is sized like a server's (migrations.MinConns).
func BenchmarkTake(b *testing.B) {
	for _, tc := range []struct {
		name  string
		batch int
		key   func(i int64) string
	}{
		{"select-1", 0, nil},
		{"one-key/batch-1", 1, func(int64) string { return "pep" }},
		{"many-keys/batch-1", 1, func(i int64) string { return strconv.FormatInt(i%1000, 10) }},
		{"one-key/batch-100", 100, func(int64) string { return "pep" }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			cfg, err := pgxpool.ParseConfig(dbtest.URL(b))
			require.NoError(b, err)
			cfg.MaxConns = 20
			p, err := pgxpool.NewWithConfig(context.Background(), cfg)
			require.NoError(b, err)
			defer p.Close()
			b.SetParallelism(8)
			if tc.key == nil {
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						var one int
						if err := p.QueryRow(context.Background(), "SELECT 1").Scan(&one); err != nil {
							b.Error(err)
							return
						}
					}
				})
				return
			}
			l, err := ratelimit.NewCounters(p, table).NewLimiter("bench", 1<<30, time.Hour)
			require.NoError(b, err)
			ratelimit.SetBatch(l, tc.batch)
			var n atomic.Int64
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					res, err := l.Take(context.Background(), tc.key(n.Add(1)))
					if err != nil || !res.Allowed {
						b.Errorf("take: %v %+v", err, res)
						return
					}
				}
			})
		})
	}
}
