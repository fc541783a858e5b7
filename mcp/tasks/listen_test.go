package tasks_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/mcp/tasks"
)

const alice = "user:alice|agent:demo"

// listenEnv is a listen-serving wrapper on a fresh database; the caller's
// principal comes from the X-Test-Principal header.
type listenEnv struct {
	store    *tasks.Store
	notifier *tasks.Notifier
	url      string
}

func newListenEnv(t *testing.T, cfg tasks.ListenConfig, tune func(*http.Server)) *listenEnv {
	t.Helper()
	store := &tasks.Store{DB: dbtest.New(t)}
	n := tasks.NewNotifier(store.DB, cfg)
	require.NoError(t, n.Start(context.Background()))
	t.Cleanup(n.Stop)
	wrapped := (&tasks.Server{Store: store, Notifier: n}).Wrap(http.NotFoundHandler())
	h := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		wrapped.ServeHTTP(w, r.WithContext(tasks.WithPrincipal(r.Context(), r.Header.Get("X-Test-Principal"))))
	}))
	if tune != nil {
		tune(h.Config)
	}
	h.Start()
	t.Cleanup(h.Close)
	return &listenEnv{store: store, notifier: n, url: h.URL}
}

// stream is an open listen stream: its HTTP status, and its messages as
// they arrive (the channel closes when the stream ends).
type stream struct {
	status int
	body   []byte // a refused stream's response
	events chan map[string]any
	cancel context.CancelFunc
}

func (e *listenEnv) listen(t *testing.T, principal string, id int, ids ...string) *stream {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": tasks.MethodListen, "params": map[string]any{
		"notifications": map[string]any{"taskIds": ids},
		"_meta": map[string]any{tasks.MetaProtocolVersion: tasks.ProtocolVersion,
			tasks.MetaClientCapabilities: map[string]any{"extensions": map[string]any{tasks.ExtensionID: map[string]any{}}}}}})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url, strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set(tasks.HeaderProtocolVersion, tasks.ProtocolVersion)
	req.Header.Set(tasks.HeaderMethod, tasks.MethodListen)
	req.Header.Set("X-Test-Principal", principal)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	s := &stream{status: resp.StatusCode, events: make(chan map[string]any, 64), cancel: cancel}
	if resp.StatusCode != http.StatusOK {
		s.body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		close(s.events)
		return s
	}
	go func() {
		defer close(s.events)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var m map[string]any
				if json.Unmarshal([]byte(d), &m) == nil {
					s.events <- m
				}
			}
		}
	}()
	return s
}

// next returns the stream's next message, failing after a generous wait;
// nil means the stream ended.
func (s *stream) next(t *testing.T) map[string]any {
	t.Helper()
	select {
	case m, ok := <-s.events:
		if !ok {
			return nil
		}
		return m
	case <-time.After(15 * time.Second):
		t.Fatal("no message on the stream")
		return nil
	}
}

// acked reads the acknowledgement and returns the task ids it names.
func (s *stream) acked(t *testing.T) []any {
	t.Helper()
	require.Equal(t, http.StatusOK, s.status, string(s.body))
	m := s.next(t)
	require.Equal(t, tasks.NotificationAcknowledged, m["method"], m)
	return m["params"].(map[string]any)["notifications"].(map[string]any)["taskIds"].([]any)
}

// update reads the next notifications/tasks and returns its params.
func (s *stream) update(t *testing.T) map[string]any {
	t.Helper()
	m := s.next(t)
	require.NotNil(t, m, "the stream ended")
	require.Equal(t, tasks.NotificationTasks, m["method"], m)
	return m["params"].(map[string]any)
}

// ended reads the listen result and the end of the stream.
func (s *stream) ended(t *testing.T, id int) {
	t.Helper()
	m := s.next(t)
	require.NotNil(t, m, "the stream ended without its result")
	require.EqualValues(t, id, m["id"], m)
	res := m["result"].(map[string]any)
	require.Equal(t, tasks.ResultTypeComplete, res["resultType"])
	require.EqualValues(t, id, res["_meta"].(map[string]any)[tasks.MetaSubscriptionID])
	require.Nil(t, s.next(t), "the stream closes after its result")
}

// TestListenIsEventDriven: with the safety re-read an hour away, a change
// reaches the stream through the Store's notification alone.
func TestListenIsEventDriven(t *testing.T) {
	t.Parallel()
	e := newListenEnv(t, tasks.ListenConfig{Resync: time.Hour}, nil)
	task := create(t, e.store, nil)
	other := create(t, e.store, nil)
	s := e.listen(t, alice, 7, task.ID, other.ID)
	require.ElementsMatch(t, []any{task.ID, other.ID}, s.acked(t))
	seen := map[any]any{}
	for range 2 {
		u := s.update(t)
		seen[u["taskId"]] = u["status"]
		require.EqualValues(t, 7, u["_meta"].(map[string]any)[tasks.MetaSubscriptionID])
	}
	require.Equal(t, map[any]any{task.ID: "working", other.ID: "working"}, seen, "the current state first")

	_, err := transition(e.store, task.ID, tasks.Change{To: tasks.InputRequired, InputRequests: map[string]any{"k": map[string]any{}}})
	require.NoError(t, err)
	u := s.update(t)
	require.Equal(t, task.ID, u["taskId"])
	require.Equal(t, "input_required", u["status"])
	_, err = transition(e.store, task.ID, tasks.Change{To: tasks.Completed, Result: json.RawMessage(`{"content":[]}`)})
	require.NoError(t, err)
	u = s.update(t)
	require.Equal(t, "completed", u["status"])
	require.Contains(t, u, "result")
	_, err = transition(e.store, other.ID, tasks.Change{To: tasks.Cancelled})
	require.NoError(t, err)
	require.Equal(t, "cancelled", s.update(t)["status"])
	s.ended(t, 7)
}

// TestListenResyncCatchesALostChange: a change whose notification never
// came (here: written without one) still arrives, at the next re-read.
func TestListenResyncCatchesALostChange(t *testing.T) {
	t.Parallel()
	e := newListenEnv(t, tasks.ListenConfig{Resync: 200 * time.Millisecond}, nil)
	task := create(t, e.store, nil)
	s := e.listen(t, alice, 1, task.ID)
	s.acked(t)
	require.Equal(t, "working", s.update(t)["status"])
	_, err := e.store.DB.Exec(context.Background(), `UPDATE pep.tasks SET status = 'cancelled', terminal_at = now(), updated_at = now() WHERE id = $1`, task.ID)
	require.NoError(t, err)
	require.Equal(t, "cancelled", s.update(t)["status"])
	s.ended(t, 1)
}

// TestListenSurvivesALostConnection: when the listening connection dies,
// the notifier reconnects and every stream re-reads its tasks, so a change
// made while nobody listened is delivered.
func TestListenSurvivesALostConnection(t *testing.T) {
	t.Parallel()
	e := newListenEnv(t, tasks.ListenConfig{Resync: time.Hour}, nil)
	task := create(t, e.store, nil)
	s := e.listen(t, alice, 1, task.ID)
	s.acked(t)
	require.Equal(t, "working", s.update(t)["status"])
	var killed int
	// OFFSET 0 keeps the filter apart from the terminating call.
	require.NoError(t, e.store.DB.QueryRow(context.Background(), `SELECT count(*) FROM (SELECT pid FROM pg_stat_activity
		WHERE application_name = 'arap-tasks-notifier' AND datname = current_database() OFFSET 0) n WHERE pg_terminate_backend(pid)`).Scan(&killed))
	require.Equal(t, 1, killed)
	_, err := transition(e.store, task.ID, tasks.Change{To: tasks.Cancelled})
	require.NoError(t, err)
	require.Equal(t, "cancelled", s.update(t)["status"])
	s.ended(t, 1)
}

// TestListenStreamCap: a principal holds at most MaxStreams streams, even
// when they are all opened at once; the rest get a clear JSON-RPC error, and
// a closed stream frees its place. Other principals are unaffected.
func TestListenStreamCap(t *testing.T) {
	t.Parallel()
	e := newListenEnv(t, tasks.ListenConfig{MaxStreams: 3}, nil)
	task := create(t, e.store, nil)
	streams := make([]*stream, 12)
	var wg sync.WaitGroup
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			streams[i] = e.listen(t, alice, i, task.ID)
		}()
	}
	wg.Wait()
	var open []*stream
	for _, s := range streams {
		if s.status == http.StatusOK {
			open = append(open, s)
			continue
		}
		require.Equal(t, http.StatusTooManyRequests, s.status)
		var resp struct {
			Error struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		require.NoError(t, json.Unmarshal(s.body, &resp), string(s.body))
		require.Equal(t, tasks.CodeTooManyStreams, resp.Error.Code)
		require.Contains(t, resp.Error.Message, "too many open subscriptions/listen streams")
	}
	require.Len(t, open, 3)
	for _, s := range open {
		s.acked(t)
	}

	mallory := e.listen(t, "user:mallory|agent:demo", 99, task.ID)
	require.Empty(t, mallory.acked(t), "another principal may listen (to nothing of alice's)")

	open[0].cancel()
	require.Eventually(t, func() bool {
		s := e.listen(t, alice, 100, task.ID)
		defer s.cancel()
		return s.status == http.StatusOK
	}, 10*time.Second, 50*time.Millisecond, "a closed stream frees its place")
}

// TestListenLifetime: a stream outlives the server's request timeouts, and
// ends with its listen result at its maximum lifetime, though its task is
// live. Each part waits for its own event: the first has no lifetime in
// its way, the second nothing but its lifetime.
func TestListenLifetime(t *testing.T) {
	t.Parallel()
	t.Run("past the server's timeouts", func(t *testing.T) {
		t.Parallel()
		const timeout = time.Second
		e := newListenEnv(t, tasks.ListenConfig{MaxLifetime: time.Hour, Resync: 300 * time.Millisecond}, func(s *http.Server) {
			s.ReadTimeout, s.WriteTimeout = timeout, timeout
		})
		task := create(t, e.store, nil)
		s := e.listen(t, alice, 5, task.ID)
		// The server set its deadlines before it answered: they have
		// passed once timeout has passed since the answer came.
		answered := time.Now()
		s.acked(t)
		require.Equal(t, "working", s.update(t)["status"])
		time.Sleep(time.Until(answered.Add(timeout)))
		_, err := transition(e.store, task.ID, tasks.Change{To: tasks.InputRequired, InputRequests: map[string]any{"k": map[string]any{}}})
		require.NoError(t, err)
		require.Equal(t, "input_required", s.update(t)["status"])
	})
	t.Run("at its maximum lifetime", func(t *testing.T) {
		t.Parallel()
		const lifetime = 300 * time.Millisecond
		e := newListenEnv(t, tasks.ListenConfig{MaxLifetime: lifetime, Resync: time.Hour}, nil)
		task := create(t, e.store, nil)
		asked := time.Now()
		s := e.listen(t, alice, 5, task.ID)
		s.acked(t)
		require.Equal(t, "working", s.update(t)["status"])
		s.ended(t, 5)
		// Its lifetime starts after the request: a lower bound, never a
		// tolerance.
		require.GreaterOrEqual(t, time.Since(asked), lifetime, "the stream ended before its lifetime")
		got, err := e.store.Get(context.Background(), e.store.DB, task.ID)
		require.NoError(t, err)
		require.False(t, got.Status.Terminal())
	})
}

// TestListenStopEndsStreams: stopping the notifier (server shutdown) ends
// every open stream with its result and refuses new ones.
func TestListenStopEndsStreams(t *testing.T) {
	t.Parallel()
	e := newListenEnv(t, tasks.ListenConfig{}, nil)
	task := create(t, e.store, nil)
	s := e.listen(t, alice, 3, task.ID)
	s.acked(t)
	require.Equal(t, "working", s.update(t)["status"])
	e.notifier.Stop()
	s.ended(t, 3)
	late := e.listen(t, alice, 4, task.ID)
	require.Equal(t, http.StatusServiceUnavailable, late.status, string(late.body))
	require.Contains(t, string(late.body), "shutting down")
	e.notifier.Stop() // again: nothing happens
}

// TestListenOnlyOwnTasks: ids of other principals' tasks and unknown ids
// are not acknowledged, and a stream with nothing to follow ends at once.
func TestListenOnlyOwnTasks(t *testing.T) {
	t.Parallel()
	e := newListenEnv(t, tasks.ListenConfig{}, nil)
	task := create(t, e.store, nil)
	s := e.listen(t, "user:mallory|agent:demo", 2, task.ID, "tsk_unknown")
	require.Empty(t, s.acked(t))
	s.ended(t, 2)
	s = e.listen(t, alice, 3, task.ID, task.ID, "tsk_unknown")
	require.Equal(t, []any{task.ID}, s.acked(t), "each id once")
}
