package callbacks_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/migrations"
)

// TestEachDeliveryWakesTheWorkers requires every decision's callback
// delivery, made more than the backend's fetch cooldown after the last, to
// notify River's workers of its insert, so that its pickup does not wait for
// the next poll. The inserting client has River's default cooldown (100 ms)
// unless the backend sets it: then most deliveries made a few tens of
// milliseconds apart, as a PEP's approvals are under load, were held back.
func TestEachDeliveryWakesTheWorkers(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{CallbackSchedule: fast()})
	rc := newReceiver(t)
	const n = 4
	ids := make([]string, n)
	for i := range ids {
		status, out := submit(t, env, dev.PEPToken, map[string]any{"endpoint": rc.URL + "/cb", "state": "s"})
		require.Equal(t, 202, status, "%v", out)
		ids[i] = out["task"].(map[string]any)["id"].(string)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, env.DBURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{migrations.RiverSchema + ".river_insert"}.Sanitize())
	require.NoError(t, err)

	for _, id := range ids {
		approve(t, env, id)
		// Longer than the backend's cooldown (10 ms), well under River's
		// default; a slower machine only spaces them further.
		time.Sleep(30 * time.Millisecond)
	}
	// Each notification was sent with its approval's commit, before the
	// approval was answered; ten seconds is for a slow machine to carry it.
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	woken := 0
	for woken < n {
		note, err := conn.WaitForNotification(ctx)
		require.NoError(t, err, "%d of %d deliveries notified their insert", woken, n)
		var p struct{ Queue string }
		require.NoError(t, json.Unmarshal([]byte(note.Payload), &p))
		if p.Queue == "default" { // the deliveries' queue; sweeps and fan-outs have their own
			woken++
		}
	}
}
