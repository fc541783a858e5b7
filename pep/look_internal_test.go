package pep

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/migrations"
)

// undecided is a backend whose every request is pending; it counts the
// status reads of each.
type undecided struct {
	*httptest.Server
	mu    sync.Mutex
	reads map[string]int
}

func newUndecided(t *testing.T) *undecided {
	u := &undecided{reads: map[string]int{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
		u.mu.Lock()
		u.reads[id]++
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(authzen.TaskResponse{Task: authzen.Task{ID: id, Status: authzen.StatusPending}})
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *undecided) read(id string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.reads[id]
}

// lookFixture is a gate (a replica) on a database of pending tasks whose
// requests the backend never decides; more replicas share the database.
type lookFixture struct {
	t       *testing.T
	db      *pgxpool.Pool
	backend *undecided
	offset  atomic.Int64 // added to every replica's clock
}

func newLookFixture(t *testing.T) *lookFixture {
	return &lookFixture{t: t, db: dbtest.New(t), backend: newUndecided(t)}
}

func (f *lookFixture) replica() *Gate {
	g, err := NewGate(Config{DB: f.db, Backend: &arapclient.Client{BaseURL: f.backend.URL}, MasterKey: make([]byte, 32), Tools: DemoTools(),
		CallbackURL: "http://127.0.0.1:1/callback", // the first look comes after the safety poll
		Now:         func() time.Time { return time.Now().Add(time.Duration(f.offset.Load())) }})
	require.NoError(f.t, err)
	f.t.Cleanup(g.Stop)
	return g
}

// pending writes n tasks waiting on backend requests arq_<prefix><i>, each
// due for a look now.
func (f *lookFixture) pending(prefix string, n int) []string {
	ctx := context.Background()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	_, err := f.db.Exec(ctx, `INSERT INTO pep.tasks (id, principal, kind, status, created_at, updated_at, poll_interval_ms)
		SELECT id, 'user:alice|', $2, 'working', now(), now(), 1000 FROM unnest($1::text[]) AS id`, ids, KindApproval)
	require.NoError(f.t, err)
	_, err = f.db.Exec(ctx, `INSERT INTO pep.approval_tasks (task_id, tool, args_sealed, args_digest, principal, dedup_key, phase, generation,
			backend_id, status_url, deadline, window_end, look_at, created_at, updated_at)
		SELECT id, 'wire_transfer', '\x00', 'd', 'user:alice|', id, 'pending', 1,
			'arq_' || id, $2 || '/access/v1/requests/arq_' || id, now() + interval '1 hour', now() + interval '1 hour', now(), now(), now()
		FROM unnest($1::text[]) AS id`, ids, f.backend.URL)
	require.NoError(f.t, err)
	return ids
}

func (f *lookFixture) lookAt(id string) *time.Time {
	var at *time.Time
	require.NoError(f.t, f.db.QueryRow(context.Background(), `SELECT look_at FROM pep.approval_tasks WHERE task_id = $1`, id).Scan(&at))
	return at
}

// TestLookLeaseOutlivesItsReplica: a replica that took a task's look and
// died holds it only for the lease; then another replica looks at it.
func TestLookLeaseOutlivesItsReplica(t *testing.T) {
	ctx := context.Background()
	f := newLookFixture(t)
	dead, alive := f.replica(), f.replica()
	ids := f.pending("tsk_lease", 3)

	// The replica that dies takes the looks and never makes them.
	taken, err := takeLooks(ctx, dead.cfg.DB, dead.now(), dead.now().Add(dead.LookLease()), lookWorkers)
	require.NoError(t, err)
	require.ElementsMatch(t, ids, taken)
	n, err := alive.LookDue(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "leased looks are not taken again within the lease")

	f.offset.Store(int64(alive.LookLease() + time.Second))
	n, err = alive.LookDue(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n, "once the lease has passed, another replica looks")
	for _, id := range ids {
		require.Equal(t, 1, f.backend.read("arq_"+id), "one status read per task")
		at := f.lookAt(id)
		require.NotNil(t, at)
		require.WithinDuration(t, alive.now().Add(SafetyPoll), *at, 2*time.Second, "the look schedules the next one: the safety poll")
	}
	n, err = alive.LookDue(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "nothing is due until the next look")
}

// TestReplicasShareTheSweep: replicas sweeping at once look at every due
// task exactly once.
func TestReplicasShareTheSweep(t *testing.T) {
	ctx := context.Background()
	f := newLookFixture(t)
	ids := f.pending("tsk_share", 150)
	var wg sync.WaitGroup
	var looked atomic.Int64
	for range 3 {
		g := f.replica()
		wg.Go(func() {
			for {
				n, err := g.LookDue(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if n == 0 {
					return
				}
				looked.Add(int64(n))
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, len(ids), looked.Load())
	for _, id := range ids {
		require.Equal(t, 1, f.backend.read("arq_"+id), "task %s", id)
	}
}

// TestLookKeepsWhatAMoveScheduled: a look that acted on a task as it was
// does not overwrite what the task's later move set (a new request's first
// look, a claim's deadline); only tasks waiting (for a decision or for
// input) or running are looked at: a submitting task is the reconciler's.
func TestLookKeepsWhatAMoveScheduled(t *testing.T) {
	ctx := context.Background()
	f := newLookFixture(t)
	g := f.replica()
	id := f.pending("tsk_moved", 1)[0]
	read := &approvalTask{TaskID: id, Phase: phasePending, Generation: 1}

	later := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	_, err := f.db.Exec(ctx, `UPDATE pep.approval_tasks SET generation = 2, look_at = $2 WHERE task_id = $1`, id, later)
	require.NoError(t, err)
	require.NoError(t, scheduleLook(ctx, f.db, read, time.Now()))
	require.True(t, later.Equal(*f.lookAt(id)), "a look at generation 1 leaves generation 2's schedule")

	_, err = f.db.Exec(ctx, `UPDATE pep.approval_tasks SET generation = 1, phase = 'claimed' WHERE task_id = $1`, id)
	require.NoError(t, err)
	require.NoError(t, scheduleLook(ctx, f.db, read, time.Now()))
	require.True(t, later.Equal(*f.lookAt(id)), "a look that read it pending leaves the claim's schedule")

	for _, ph := range []phase{phaseSubmitting, phaseDone} {
		_, err = f.db.Exec(ctx, `UPDATE pep.approval_tasks SET phase = $2, look_at = now() - interval '1 minute' WHERE task_id = $1`, id, string(ph))
		require.NoError(t, err)
		n, err := g.LookDue(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "a task in phase %s is not looked at", ph)
	}
	require.Zero(t, f.backend.read("arq_"+id))
}

// TestOlderTrackingJobHandsOver: a tracking job enqueued by an older
// version brings its task's look forward (and ends); a task that ended
// stays unlooked.
func TestOlderTrackingJobHandsOver(t *testing.T) {
	ctx := context.Background()
	f := newLookFixture(t)
	g := f.replica()
	ids := f.pending("tsk_old", 2)
	_, err := f.db.Exec(ctx, `UPDATE pep.approval_tasks SET look_at = NULL WHERE task_id = $1`, ids[0]) // bound by an older binary
	require.NoError(t, err)
	_, err = f.db.Exec(ctx, `UPDATE pep.approval_tasks SET look_at = now() + interval '1 hour', phase = 'done' WHERE task_id = $1`, ids[1])
	require.NoError(t, err)
	w := &TrackWorker{Gate: g}
	for _, id := range ids {
		require.NoError(t, w.Work(ctx, &river.Job[TrackArgs]{JobRow: &rivertype.JobRow{}, Args: TrackArgs{TaskID: id}}))
	}
	require.NotNil(t, f.lookAt(ids[0]))
	require.WithinDuration(t, time.Now(), *f.lookAt(ids[0]), 5*time.Second, "the older task is looked at now")
	require.True(t, f.lookAt(ids[1]).After(time.Now().Add(time.Minute)), "an ended task is left alone")
	n, err := g.LookDue(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 1, f.backend.read("arq_"+ids[0]))
}

// TestBusyWakeBringsTheLookForward: a callback that finds every wake-up
// slot taken leaves the task to the sweep's next round, not to its safety
// poll.
func TestBusyWakeBringsTheLookForward(t *testing.T) {
	ctx := context.Background()
	f := newLookFixture(t)
	g := f.replica()
	id := f.pending("tsk_busy", 1)[0]
	_, err := f.db.Exec(ctx, `UPDATE pep.approval_tasks SET look_at = now() + interval '30 seconds' WHERE task_id = $1`, id)
	require.NoError(t, err)
	for len(g.advance) < cap(g.advance) {
		g.advance <- struct{}{}
	}
	require.NoError(t, g.Wake(ctx, id, "arq_"+id))
	require.WithinDuration(t, time.Now(), *f.lookAt(id), 5*time.Second, "the look is due now")
	n, err := g.LookDue(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 1, f.backend.read("arq_"+id))
}

// TestLookInFlightKeepsASoonerLook: a look that read the task before a
// callback brought its look forward (every wake-up slot taken) does not
// push it back when it ends; nor does a look that read it before another
// replica scheduled a sooner one. Untouched, its own schedule stands.
func TestLookInFlightKeepsASoonerLook(t *testing.T) {
	ctx := context.Background()
	f := newLookFixture(t)
	g := f.replica()
	id := f.pending("tsk_inflight", 1)[0]
	for len(g.advance) < cap(g.advance) {
		g.advance <- struct{}{}
	}

	taken, err := takeLooks(ctx, f.db, g.now(), g.now().Add(g.LookLease()), lookWorkers)
	require.NoError(t, err)
	require.Equal(t, []string{id}, taken)
	read, err := getApproval(ctx, f.db, id) // the look reads the task: pending
	require.NoError(t, err)
	require.NoError(t, g.Wake(ctx, id, "arq_"+id)) // approved meanwhile; no slot free
	require.NoError(t, scheduleLook(ctx, f.db, read, g.now().Add(SafetyPoll)))
	require.WithinDuration(t, time.Now(), *f.lookAt(id), 5*time.Second, "the callback's look stands")

	read, err = getApproval(ctx, f.db, id)
	require.NoError(t, err)
	require.NoError(t, scheduleLook(ctx, f.db, read, g.now().Add(SafetyPoll)))
	require.WithinDuration(t, time.Now().Add(SafetyPoll), *f.lookAt(id), 5*time.Second, "untouched, the look's own schedule stands")
}

// TestRollbackSQL: deploy/rollback/pep-0008.sql gives each task that waits
// or runs one tracking job, which River works (here the handover worker,
// as an older version's would be), and a second run adds none.
func TestRollbackSQL(t *testing.T) {
	ctx := context.Background()
	f := newLookFixture(t)
	g := f.replica()
	ids := f.pending("tsk_back", 3)
	_, err := f.db.Exec(ctx, `UPDATE pep.approval_tasks SET phase = 'done' WHERE task_id = $1`, ids[2])
	require.NoError(t, err)
	_, err = f.db.Exec(ctx, `UPDATE pep.approval_tasks SET look_at = now() + interval '1 hour' WHERE task_id = ANY($1)`, ids)
	require.NoError(t, err)
	sql, err := os.ReadFile("../deploy/rollback/pep-0008.sql")
	require.NoError(t, err)
	for range 2 {
		_, err = f.db.Exec(ctx, string(sql))
		require.NoError(t, err)
	}
	jobs := func(id string) int {
		var n int
		require.NoError(t, f.db.QueryRow(ctx, `SELECT count(*) FROM pep_river.river_job WHERE kind = 'pep.track' AND args->>'task_id' = $1`, id).Scan(&n))
		return n
	}
	require.Equal(t, []int{1, 1, 0}, []int{jobs(ids[0]), jobs(ids[1]), jobs(ids[2])}, "one job per live task, however often it runs")

	workers := river.NewWorkers()
	g.AddWorkers(workers)
	client, err := river.NewClient(riverpgxv5.New(f.db), &river.Config{Schema: migrations.PEPRiverSchema, Workers: workers,
		Queues: map[string]river.QueueConfig{Queue: {MaxWorkers: 2}}, FetchPollInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	t.Cleanup(func() { _ = client.Stop(context.Background()) })
	require.Eventually(t, func() bool {
		var done int
		_ = f.db.QueryRow(ctx, `SELECT count(*) FROM pep_river.river_job WHERE kind = 'pep.track' AND state = 'completed'`).Scan(&done)
		return done == 2
	}, 30*time.Second, 50*time.Millisecond, "River works the jobs")
	for _, id := range ids[:2] {
		require.WithinDuration(t, time.Now(), *f.lookAt(id), 30*time.Second, "the job reached its task")
	}
}

// TestCallerCheckUsesItsIndex: the claim's check that its caller is live
// reads one index entry, not every caller (migrations/pep 0009).
func TestCallerCheckUsesItsIndex(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	_, err := db.Exec(ctx, `INSERT INTO pep.callers (token_hash, name, subject_type, subject_id, actor_id, created_at)
		SELECT sha256(n::text::bytea), 'c' || n, 'user', 'u' || n, 'agent:a', now() FROM generate_series(1, 2000) n`)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `ANALYZE pep.callers`)
	require.NoError(t, err)
	rows, err := db.Query(ctx, `EXPLAIN SELECT `+callerLive("$1::text"), "user:u7|agent:a")
	require.NoError(t, err)
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Contains(t, strings.Join(plan, "\n"), "callers_live_key", "the plan: %s", strings.Join(plan, "\n"))
}
