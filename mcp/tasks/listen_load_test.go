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

// TestListenLoad measures what idle subscriptions/listen streams cost:
// 200 streams from one principal, each on the principal's 20 live tasks,
// none of which changes. It prints PostgreSQL commits/s (xact_commit delta
// of the test database) and the CPU of this process and of the PostgreSQL
// cluster over the window. Only with ARAP_LISTEN_LOAD=1: it is a
// measurement, not a check. The cap on streams per principal is raised
// for it.
func TestListenLoad(t *testing.T) {
	if os.Getenv("ARAP_LISTEN_LOAD") == "" {
		t.Skip("set ARAP_LISTEN_LOAD=1 to measure idle listen streams")
	}
	const streams, perStream = 200, 20
	window := 30 * time.Second // one resync period: every stream re-reads once
	ctx := context.Background()
	db := dbtest.New(t)
	store := &tasks.Store{DB: db}
	principal := "user:load|agent:demo"
	var ids []string
	for range perStream {
		task := &tasks.Task{ID: tasks.NewID(), Principal: principal, Kind: "k", PollIntervalMs: 1000}
		require.NoError(t, pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return store.CreateTx(ctx, tx, task) }))
		ids = append(ids, task.ID)
	}
	srv := loadServer(t, store)
	h := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		srv.ServeHTTP(w, r.WithContext(tasks.WithPrincipal(r.Context(), principal)))
	}))
	t.Cleanup(h.Close)

	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	acked := make(chan error, streams)
	for i := range streams {
		go func() { acked <- openIdle(lctx, h.URL, i, ids) }()
	}
	for range streams {
		require.NoError(t, <-acked)
	}
	time.Sleep(3 * time.Second) // the first reads of every stream pass, and their statistics are flushed

	commits0 := xactCommit(t, db)
	self0, pg0 := selfCPU(), clusterCPU(t, db)
	start := time.Now()
	time.Sleep(window)
	elapsed := time.Since(start).Seconds()
	commits1 := xactCommit(t, db)
	self1, pg1 := selfCPU(), clusterCPU(t, db)
	fmt.Printf("listen load: %d idle streams x %d tasks over %.1fs: %.0f commits/s; CPU: server process %.1f%%, PostgreSQL %.1f%% (of one core)\n",
		streams, perStream, elapsed, float64(commits1-commits0)/elapsed,
		100*(self1-self0).Seconds()/elapsed, 100*(pg1-pg0).Seconds()/elapsed)
}

// openIdle opens one listen stream on ids and returns once it is
// acknowledged; the stream is read (and discarded) until ctx ends.
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
	for sc.Scan() {
		if strings.Contains(sc.Text(), tasks.NotificationAcknowledged) {
			go func() {
				defer resp.Body.Close()
				for sc.Scan() {
				}
			}()
			return nil
		}
	}
	resp.Body.Close()
	return fmt.Errorf("stream %d ended before its acknowledgement (status %d)", n, resp.StatusCode)
}

func xactCommit(t *testing.T, db *pgxpool.Pool) int64 {
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
func clusterCPU(t *testing.T, db *pgxpool.Pool) time.Duration {
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

// loadServer is the listen-serving wrapper around a handler that serves
// nothing else.
func loadServer(t *testing.T, store *tasks.Store) http.Handler {
	t.Helper()
	n := tasks.NewNotifier(store.DB, tasks.ListenConfig{MaxStreams: 1000})
	require.NoError(t, n.Start(context.Background()))
	t.Cleanup(n.Stop)
	srv := &tasks.Server{Store: store, Notifier: n}
	return srv.Wrap(http.NotFoundHandler())
}
