package tasks_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/mcp/tasks"
)

// TestIdleStreamsHoldNoConnection: a listen stream waits on the notifier,
// not on the database. With 50 streams open on a principal's 20 live
// tasks, each acknowledged and past its first read, no pooled connection
// is held, and the database has no connection beyond the pool's own and
// the notifier's one: a stream that kept a connection (its own LISTEN, a
// transaction left open) would exhaust either at scale.
func TestIdleStreamsHoldNoConnection(t *testing.T) {
	t.Parallel()
	const streams, perStream = 50, 20
	db, url, ids := idleStreamsEnv(t, streams, perStream)
	// A generous bound, so a stream that never gets its first read fails
	// the test instead of hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	openIdleStreams(t, ctx, url, streams, ids)

	require.Zero(t, db.Stat().AcquiredConns(), "pooled connections held by idle streams")
	var others int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name <> 'arap-tasks-notifier'`).Scan(&others))
	require.LessOrEqual(t, others, int(db.Stat().TotalConns()), "connections outside the pool")
}

// BenchmarkIdleListenStreams measures what idle listen streams cost (the
// figures of docs/reference.md, "Idle streams cost the database nothing"):
// 200 streams from one principal, each on the principal's 20 live tasks,
// none of which changes, over one resync period (30 s, when every stream
// re-reads once). It reports PostgreSQL commits/s (xact_commit delta of the
// test database) and the CPU of this process and of the PostgreSQL cluster
// over the window. A measurement, not a check: run it with
// go test ./mcp/tasks -run '^$' -bench IdleListenStreams -benchtime 1x.
func BenchmarkIdleListenStreams(b *testing.B) {
	const streams, perStream = 200, 20
	window := 30 * time.Second
	db, url, ids := idleStreamsEnv(b, streams, perStream)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	openIdleStreams(b, ctx, url, streams, ids)
	time.Sleep(3 * time.Second) // the statistics of the first reads are flushed
	for b.Loop() {
		commits0 := xactCommit(b, db)
		self0, pg0 := selfCPU(), clusterCPU(b, db)
		start := time.Now()
		time.Sleep(window)
		elapsed := time.Since(start).Seconds()
		commits1 := xactCommit(b, db)
		self1, pg1 := selfCPU(), clusterCPU(b, db)
		b.ReportMetric(float64(commits1-commits0)/elapsed, "commits/s")
		b.ReportMetric(100*(self1-self0).Seconds()/elapsed, "server-cpu-%")
		b.ReportMetric(100*(pg1-pg0).Seconds()/elapsed, "postgres-cpu-%")
	}
}

// idleStreamsEnv is a listen-serving wrapper on a fresh database, with
// room for streams streams of one principal, and that principal's
// perStream live tasks.
func idleStreamsEnv(tb testing.TB, streams, perStream int) (*pgxpool.Pool, string, []string) {
	tb.Helper()
	ctx := context.Background()
	db := dbtest.New(tb)
	store := &tasks.Store{DB: db}
	var ids []string
	for range perStream {
		task := &tasks.Task{ID: tasks.NewID(), Principal: loadPrincipal, Kind: "k", PollIntervalMs: 1000}
		require.NoError(tb, pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return store.CreateTx(ctx, tx, task) }))
		ids = append(ids, task.ID)
	}
	n := tasks.NewNotifier(store.DB, tasks.ListenConfig{MaxStreams: streams})
	require.NoError(tb, n.Start(ctx))
	tb.Cleanup(n.Stop)
	srv := (&tasks.Server{Store: store, Notifier: n}).Wrap(http.NotFoundHandler())
	h := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		srv.ServeHTTP(w, r.WithContext(tasks.WithPrincipal(r.Context(), loadPrincipal)))
	}))
	tb.Cleanup(h.Close)
	return db, h.URL, ids
}

const loadPrincipal = "user:load|agent:demo"

// openIdleStreams opens streams listen streams on ids and returns once
// every one has been acknowledged and has carried each task once (its
// first read done); they are read until ctx ends.
func openIdleStreams(tb testing.TB, ctx context.Context, url string, streams int, ids []string) {
	tb.Helper()
	ready := make(chan error, streams)
	for i := range streams {
		go func() { ready <- openIdle(ctx, url, i, ids) }()
	}
	for range streams {
		require.NoError(tb, <-ready)
	}
}

// openIdle opens one listen stream on ids and returns once it is
// acknowledged and has carried one notifications/tasks per id; the stream
// is read (and discarded) until ctx ends.
func openIdle(ctx context.Context, url string, n int, ids []string) error {
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": n, "method": tasks.MethodListen, "params": map[string]any{
		"notifications": map[string]any{"taskIds": ids},
		"_meta": map[string]any{tasks.MetaProtocolVersion: tasks.ProtocolVersion,
			tasks.MetaClientCapabilities: map[string]any{"extensions": map[string]any{tasks.ExtensionID: map[string]any{}}}}}})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set(tasks.HeaderProtocolVersion, tasks.ProtocolVersion)
	req.Header.Set(tasks.HeaderMethod, tasks.MethodListen)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	acked, carried := false, 0
	for sc.Scan() {
		line := sc.Text()
		acked = acked || strings.Contains(line, tasks.NotificationAcknowledged)
		if strings.HasPrefix(line, "data: ") && strings.Contains(line, `"method":"`+tasks.NotificationTasks+`"`) {
			carried++
		}
		if acked && carried == len(ids) {
			go func() {
				defer resp.Body.Close()
				for sc.Scan() {
				}
			}()
			return nil
		}
	}
	resp.Body.Close()
	return fmt.Errorf("stream %d ended after %d of its %d tasks (acknowledged: %v, status %d, %v)", n, carried, len(ids), acked, resp.StatusCode, sc.Err())
}

func xactCommit(t testing.TB, db *pgxpool.Pool) int64 {
	t.Helper()
	var n int64
	require.NoError(t, db.QueryRow(context.Background(), `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&n))
	return n
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// clusterCPU is the CPU time used so far by the test cluster's postmaster
// and its children (other clusters on the machine are not counted).
func clusterCPU(t testing.TB, db *pgxpool.Pool) time.Duration {
	t.Helper()
	var dir string
	require.NoError(t, db.QueryRow(context.Background(), `SHOW data_directory`).Scan(&dir))
	raw, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	require.NoError(t, err)
	postmaster, _ := strconv.Atoi(strings.SplitN(string(raw), "\n", 2)[0])
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	var ticks int64
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		pid, _ := strconv.Atoi(strings.Split(filepath.Base(filepath.Dir(p)), "/")[0])
		ppid, _ := strconv.Atoi(f[1])
		if pid != postmaster && ppid != postmaster {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += ut + st
	}
	return time.Duration(ticks) * (time.Second / 100) // USER_HZ
}
