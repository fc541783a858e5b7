package pep_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
)

// TestSettledIntentsDropTheirBody: an intent's sealed submission body is
// kept while the intent may still be submitted (open, its submission in
// flight) and dropped once it is settled, bound or failed: only open and
// abandoned intents are ever submitted (migrations/pep 0011).
func TestSettledIntentsDropTheirBody(t *testing.T) {
	p := newPEP(t, pepOptions{})
	ctx := context.Background()
	intent := func(taskID string) (state string, kept bool) {
		t.Helper()
		require.NoError(t, p.db.QueryRow(ctx, `SELECT state, body_sealed IS NOT NULL FROM pep.intents WHERE task_id = $1`, taskID).Scan(&state, &kept))
		return state, kept
	}
	var held atomic.Int32 // open intents with their body, seen while a submission is in flight
	var refuse atomic.Bool
	var stored atomic.Value // the open bodies as stored, seen then
	p.onBackend(func(r *http.Request, _ []byte) {
		if r.URL.Path != authzen.PathRequests {
			return
		}
		var n int32
		var bodies []byte // every open body, as stored
		require.NoError(t, p.db.QueryRow(ctx, `SELECT count(*), coalesce(string_agg(body_sealed, ''), '') FROM pep.intents
			WHERE state = 'intent' AND body_sealed IS NOT NULL`).Scan(&n, &bodies))
		held.Store(n)
		stored.Store(string(bodies))
		if refuse.Load() { // a body the backend refuses (400): nothing is created
			r.Body, r.ContentLength, r.GetBody = io.NopCloser(strings.NewReader(`{}`)), 2, nil
		}
	})

	id := p.transfer(t, 30001)
	require.Equal(t, int32(1), held.Load(), "the intent kept its body while it was submitted")
	for _, plain := range []string{"acct-30001", "binding_token", "wire_transfer"} {
		require.NotContains(t, stored.Load(), plain, "a kept body is sealed")
	}
	state, kept := intent(id)
	require.Equal(t, "bound", state)
	require.False(t, kept, "a bound intent keeps no body")

	// A runner that wrote it and is only now submitting finds it ended:
	// nothing to send, no error.
	var key string
	require.NoError(t, p.db.QueryRow(ctx, `SELECT key FROM pep.intents WHERE task_id = $1`, id).Scan(&key))
	sent := held.Swap(-1)
	require.NoError(t, p.gate.SubmitAndBind(ctx, key), "a late binder finds the intent ended")
	require.Equal(t, int32(-1), held.Load(), "an ended intent is not submitted again")
	held.Store(sent)

	refuse.Store(true)
	_, err := p.alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-refused", "amount": 30002}, nil)
	require.ErrorContains(t, err, "could not be submitted")
	require.Equal(t, int32(1), held.Load())
	var taskID string
	require.NoError(t, p.db.QueryRow(ctx, `SELECT task_id FROM pep.intents WHERE task_id <> $1`, id).Scan(&taskID))
	state, kept = intent(taskID)
	require.Equal(t, "failed", state)
	require.False(t, kept, "a refused intent keeps no body")
}
