package webui

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDelaySchedule(t *testing.T) {
	want := map[int]time.Duration{1: 0, 2: 0, 3: 0, 4: time.Second, 5: 2 * time.Second, 6: 4 * time.Second,
		13: 512 * time.Second, 14: maxDelay, 15: maxDelay, 1000: maxDelay, 1 << 30: maxDelay}
	for n, d := range want {
		require.Equal(t, d, delay(n), "delay(%d)", n)
	}
}
