package arap_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dev"
)

// auditPage reads one page of GET /v1/audit.
func auditPage(t *testing.T, a api, query string) audit.Page {
	t.Helper()
	r := a.do("GET", "/v1/audit?"+query, nil)
	require.Equal(t, 200, r.status, "body: %s", r.body)
	var p audit.Page
	require.NoError(t, json.Unmarshal(r.body, &p))
	require.NotEmpty(t, p.Next)
	return p
}

func auditClient(t *testing.T, env *backendtest.Env) api {
	t.Helper()
	_, token, err := env.Backend.Clients().Create(context.Background(), clients.New{Name: "siem", Scopes: []string{clients.ScopeAudit}, Kind: clients.KindAutomation}, "test")
	require.NoError(t, err)
	return api{t: t, base: env.URL, token: token}
}

// appendSystem appends n system events in one transaction.
func appendSystem(ctx context.Context, env *backendtest.Env, n int, tag string) error {
	return pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error {
		for i := range n {
			if err := audit.Append(ctx, tx, audit.Event{Chain: audit.SystemChain, Kind: "test.event", Actor: "test", Data: map[string]any{"tag": tag, "i": i}}); err != nil {
				return err
			}
		}
		return nil
	})
}

func TestAuditStreamScopeAndErrors(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{})
	siem := auditClient(t, env)

	// Other scopes, admin included, do not read the trail.
	itsm := api{t: t, base: env.URL, token: dev.ITSMToken}
	itsm.do("GET", "/v1/audit", nil).problem(t, 403, authzen.ProblemInsufficientScope)
	api{t: t, base: env.URL}.do("GET", "/v1/audit", nil).problem(t, 401, authzen.ProblemUnauthorized)

	p := auditPage(t, siem, "")
	require.NotEmpty(t, p.Events, "the seeding wrote events")
	for _, q := range []string{
		"after=nonsense", "after=a1.AAAA", "after=" + url.QueryEscape(p.Next+"!"), // not base64url
		"since=yesterday", "since=2026-01-01", "since=2026-01-01T00:00:00Z&after=" + url.QueryEscape(p.Next),
		"limit=0", "limit=1001", "limit=ten",
	} {
		m := siem.do("GET", "/v1/audit?"+q, nil).problem(t, 400, authzen.ProblemInvalidRequest)
		t.Logf("%s: %s", q, m["detail"])
	}
}

// TestAuditStreamCompleteUnderConcurrentWrites pages through the stream
// while writers append: every event is served exactly once, none skipped,
// and the chains verify from the served events alone.
func TestAuditStreamCompleteUnderConcurrentWrites(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{})
	siem := auditClient(t, env)
	ctx := context.Background()

	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// Writers to one chain (system) and to chains of their own.
				err := appendSystem(ctx, env, 1+i%3, fmt.Sprintf("w%d-%d", w, i))
				if err == nil {
					err = pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error {
						return audit.Append(ctx, tx, audit.Event{Chain: fmt.Sprintf("chain-%d", w), Kind: "test.event", Actor: "test"})
					})
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	seen := map[int64]int{}
	var all []audit.Record
	cursor := ""
	read := func() int {
		q := "limit=7"
		if cursor != "" {
			q += "&after=" + url.QueryEscape(cursor)
		}
		p := auditPage(t, siem, q)
		for _, e := range p.Events {
			seen[e.ID]++
			all = append(all, e)
		}
		cursor = p.Next
		return len(p.Events)
	}
	for len(all) < 300 {
		read()
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	// The stream catches up once every transaction older than the last
	// events has ended (the backend's own workers write too); an event the
	// cursor had passed would never come, and this would time out.
	var ids []int64
	for deadline := time.Now().Add(30 * time.Second); ; {
		for read() > 0 {
		}
		rows, err := env.Pool.Query(ctx, `SELECT id FROM arap.audit_events`)
		require.NoError(t, err)
		ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		if len(seen) >= len(ids) {
			break
		}
		require.False(t, time.Now().After(deadline), "every event served: %d of %d after 30s", len(seen), len(ids))
		time.Sleep(20 * time.Millisecond) // polling
	}
	require.Len(t, seen, len(ids))
	for _, id := range ids {
		require.Equal(t, 1, seen[id], "event %d served once", id)
	}
	rep := audit.VerifyRecords(all)
	require.True(t, rep.OK(), "%v", rep.Breaks)
	require.Equal(t, len(ids), rep.Events)

	// A changed event breaks its chain.
	all[len(all)/2].Data = json.RawMessage(`{"tampered":true}`)
	require.False(t, audit.VerifyRecords(all).OK())
}

// TestAuditStreamWaitsForEarlierTransactions: transaction A appends first
// (its event has the smaller id) and stays open while B appends and
// commits. B's event is not served while A is in flight, so the cursor
// cannot pass A's event; once A commits, both are served, A's first.
func TestAuditStreamWaitsForEarlierTransactions(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{})
	siem := auditClient(t, env)
	ctx := context.Background()
	// Past every event written so far (the client's creation among them):
	// the stream serves one only once every transaction older than it has
	// ended, and the backend's own workers run transactions too.
	var last int64
	require.NoError(t, env.Pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM arap.audit_events`).Scan(&last))
	cursor, served := "", int64(0)
	for deadline := time.Now().Add(30 * time.Second); served < last; {
		p := auditPage(t, siem, "limit=1000&after="+url.QueryEscape(cursor))
		cursor = p.Next
		for _, e := range p.Events {
			served = max(served, e.ID)
		}
		if len(p.Events) == 0 {
			require.False(t, time.Now().After(deadline), "events up to %d served after 30s: up to %d", last, served)
			time.Sleep(20 * time.Millisecond) // polling
		}
	}
	since := time.Now()

	a, err := env.Pool.Begin(ctx)
	require.NoError(t, err)
	defer a.Rollback(ctx)
	require.NoError(t, audit.Append(ctx, a, audit.Event{Chain: "chain-a", Kind: "test.a", Actor: "test"}))
	require.NoError(t, appendSystem(ctx, env, 1, "b"))

	p := auditPage(t, siem, "after="+url.QueryEscape(cursor))
	require.Empty(t, p.Events, "B's event waits for A, which began before it and may still commit")
	require.Equal(t, cursor, p.Next)
	require.Empty(t, auditPage(t, siem, "since="+url.QueryEscape(since.UTC().Format(time.RFC3339Nano))).Events)

	require.NoError(t, a.Commit(ctx))
	p = auditPage(t, siem, "after="+url.QueryEscape(cursor))
	require.Len(t, p.Events, 2)
	require.Equal(t, "test.a", p.Events[0].Kind)
	require.Equal(t, "test.event", p.Events[1].Kind)
	require.Less(t, p.Events[0].ID, p.Events[1].ID)
	require.Empty(t, auditPage(t, siem, "after="+url.QueryEscape(p.Next)).Events)

	// since= starts the stream at a time, and its cursor keeps to it.
	s := auditPage(t, siem, "limit=1&since="+url.QueryEscape(since.UTC().Format(time.RFC3339Nano)))
	require.Equal(t, []int64{p.Events[0].ID}, []int64{s.Events[0].ID})
	s = auditPage(t, siem, "limit=5&after="+url.QueryEscape(s.Next))
	require.Len(t, s.Events, 1)
	require.Equal(t, p.Events[1].ID, s.Events[0].ID)
}
