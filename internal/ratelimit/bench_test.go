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
// hot row: the evaluation path), or each on its own key. The pool is sized
// like a server's (migrations.MinConns).
func BenchmarkTake(b *testing.B) {
	for _, tc := range []struct {
		name string
		key  func(i int64) string
	}{
		{"select-1", nil}, // the floor: one round trip that does nothing
		{"one-key", func(int64) string { return "pep" }},
		{"many-keys", func(i int64) string { return strconv.FormatInt(i%1000, 10) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			cfg, err := pgxpool.ParseConfig(dbtest.URL(b))
			require.NoError(b, err)
			cfg.MaxConns = 20
			p, err := pgxpool.NewWithConfig(context.Background(), cfg)
			require.NoError(b, err)
			defer p.Close()
			l, err := ratelimit.NewCounters(p, table).NewLimiter("bench", 1<<30, time.Hour)
			require.NoError(b, err)
			var n atomic.Int64
			b.SetParallelism(8)
			if tc.name == "select-1" {
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
