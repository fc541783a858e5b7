package bench

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestMeasureCountsAndOrders(t *testing.T) {
	i := 0
	s := Measure(context.Background(), "x", 1, 0, 300*time.Millisecond, func(ctx context.Context, _ int) (time.Duration, error) {
		i++
		if i%10 == 0 {
			return 0, errors.New("every tenth fails")
		}
		return time.Duration(i%100) * time.Millisecond, nil
	})
	require.Greater(t, s.N, 0)
	require.Greater(t, s.Errors, 0)
	require.Equal(t, "every tenth fails", s.FirstError)
	require.LessOrEqual(t, s.P50, s.P99)
	require.LessOrEqual(t, s.P99, s.Max)
	require.InDelta(t, float64(s.N)/s.Elapsed.Seconds(), s.PerSecond, 0.001)
}
