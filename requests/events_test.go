package requests_test

import (
	"context"
	"errors"
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

func (e *events) RecordTx(ctx context.Context, tx pgx.Tx, evs ...requests.Event) error {
	if e.fail {
		return errors.New("events: refused")
	}
	// A write in the change's transaction: it commits or rolls back with it.
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS public.event_marks (request_id text, kind text)`); err != nil {
		return err
	}
	for _, ev := range evs {
		if _, err := tx.Exec(ctx, `INSERT INTO public.event_marks VALUES ($1, $2)`, ev.RequestID, ev.Kind); err != nil {
			return err
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, evs...)
	return nil
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
	var err error
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
