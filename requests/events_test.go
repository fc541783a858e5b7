package requests_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/requests"
)

// events is a requests.Events that remembers what it was given (and
// writes a marker row in the change's transaction), or fails.
type events struct {
	mu   sync.Mutex
	got  []requests.Event
	fail bool
}

func (e *events) QueueTx(b *pgx.Batch, evs ...requests.Event) {
	if e.fail {
		b.Queue(`SELECT 'events: refused'::int`) // fails the batch, and with it the change
		return
	}
	// A write in the change's transaction: it commits or rolls back with it.
	for _, ev := range evs {
		b.Queue(`INSERT INTO public.event_marks VALUES ($1, $2)`, ev.RequestID, ev.Kind)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, evs...)
}

func (e *events) kinds(id string) []requests.EventKind {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []requests.EventKind
	for _, ev := range e.got {
		if ev.RequestID == id {
			out = append(out, ev.Kind)
		}
	}
	return out
}

// withEvents is f's service recording into ev.
func (f *fixture) withEvents(ev requests.Events) {
	_, err := f.db.Exec(context.Background(), `CREATE TABLE IF NOT EXISTS public.event_marks (request_id text, kind text)`)
	require.NoError(f.t, err)
	f.svc, err = requests.NewService(requests.Config{DB: f.db, Jobs: f.jobs, Keys: f.keys, Policy: f.engine,
		Issuer: issuer, RequestsURL: requestsURL, Now: f.clock.Now, Events: ev})
	require.NoError(f.t, err)
}

// TestEventsRecordedWithTheChange: creation, each vote and every way a
// request ends (decision, cancel, the expiry sweep) record their event
// through requests.Events inside the change's transaction.
func TestEventsRecordedWithTheChange(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	ev := &events{}
	f.withEvents(ev)
	ctx := context.Background()
	wire := map[string]any{"to": "acct-991", "amount": 50000}

	r := f.submitFor("alice", "wire_transfer", wire)
	require.Equal(t, []requests.EventKind{requests.EventCreated}, ev.kinds(r.ID))
	_, err := f.svc.Decide(ctx, bob, r.ID, requests.Decision{Approve: true})
	require.NoError(t, err)
	require.Equal(t, []requests.EventKind{requests.EventCreated, requests.EventDecided, requests.EventEnded}, ev.kinds(r.ID))
	ev.mu.Lock()
	require.Equal(t, requests.Event{Kind: requests.EventDecided, RequestID: r.ID, Voter: bob.ID, Decision: "approve"}, ev.got[1])
	require.Equal(t, requests.Event{Kind: requests.EventEnded, RequestID: r.ID, Status: requests.Approved}, ev.got[2])
	ev.mu.Unlock()

	c := f.submitFor("alice", "wire_transfer", wire)
	_, err = f.svc.Cancel(ctx, f.pep, c.ID, "", "")
	require.NoError(t, err)
	require.Equal(t, []requests.EventKind{requests.EventCreated, requests.EventEnded}, ev.kinds(c.ID))

	x := f.submitFor("alice", "wire_transfer", wire)
	f.clock.Advance(25 * time.Hour)
	n, err := f.svc.ExpireDue(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, []requests.EventKind{requests.EventCreated, requests.EventEnded}, ev.kinds(x.ID))

	var marks int
	require.NoError(t, f.db.QueryRow(ctx, `SELECT count(*) FROM public.event_marks`).Scan(&marks))
	require.Equal(t, 7, marks, "each event's write committed with its change")
}

// TestEventsFailRollBackTheChange: when the events cannot be recorded,
// the change does not happen: no request, no vote, no end.
func TestEventsFailRollBackTheChange(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	ctx := context.Background()
	wire := map[string]any{"to": "acct-991", "amount": 50000}
	r := f.submitFor("alice", "wire_transfer", wire) // before events fail
	ev := &events{fail: true}
	f.withEvents(ev)

	_, err := f.svc.Submit(ctx, f.pep, "", f.fresh("wire_transfer", wire))
	require.ErrorContains(t, err, "events: refused")
	var n int
	require.NoError(t, f.db.QueryRow(ctx, `SELECT count(*) FROM arap.requests`).Scan(&n))
	require.Equal(t, 1, n, "no request without its event")

	_, err = f.svc.Decide(ctx, bob, r.ID, requests.Decision{Approve: true})
	require.ErrorContains(t, err, "events: refused")
	got, err := f.svc.Load(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, requests.Pending, got.Status)
	votes, err := f.svc.Votes(ctx, r.ID)
	require.NoError(t, err)
	require.Empty(t, votes, "no vote without its event")

	_, err = f.svc.Cancel(ctx, f.pep, r.ID, "", "")
	require.ErrorContains(t, err, "events: refused")
	f.clock.Advance(25 * time.Hour)
	_, err = f.svc.ExpireDue(ctx, 10)
	require.ErrorContains(t, err, "events: refused")
	got, err = f.svc.Load(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, requests.Pending, got.Status, "no end without its event")
}
