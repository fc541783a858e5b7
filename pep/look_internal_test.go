package pep

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/dbtest"
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
	taken, err := takeLooks(ctx, dead.cfg.DB, dead.now(), dead.now().Add(LookLease), lookWorkers)
	require.NoError(t, err)
	require.ElementsMatch(t, ids, taken)
	n, err := alive.LookDue(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "leased looks are not taken again within the lease")

	f.offset.Store(int64(LookLease + time.Second))
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
// look, a claim's deadline); only tasks waiting or running are looked at.
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

	for _, ph := range []phase{phaseSubmitting, phaseInput, phaseDone} {
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
