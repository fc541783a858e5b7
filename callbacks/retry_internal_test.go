package callbacks

import (
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"
)

// TestFailedDeliveryJobRetriesSoon: a delivery job that failed (not
// snoozed) runs again within retryCap, however often it failed, and River
// never discards it for its count of failures; River's default policy
// waited the count to the fourth power in seconds (ten minutes after five
// failures), which left a delivery due in seconds undelivered past a
// chaos run's settle.
func TestFailedDeliveryJobRetriesSoon(t *testing.T) {
	w := &Worker{}
	for failures := 1; failures <= 40; failures++ {
		job := &river.Job[DeliverArgs]{JobRow: &rivertype.JobRow{Errors: make([]rivertype.AttemptError, failures)}}
		wait := time.Until(w.NextRetry(job))
		require.LessOrEqual(t, wait, retryCap+retryCap/5+time.Second, "after %d failures", failures)
		require.Greater(t, wait, time.Duration(0))
	}
	require.GreaterOrEqual(t, DeliverArgs{}.InsertOpts().MaxAttempts, 10_000)
}
