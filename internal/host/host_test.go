package host_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/host"
	"github.com/omcp/arap/migrations"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// events records what happened, in order.
type events struct {
	mu   sync.Mutex
	list []string
}

func (e *events) add(s string) { e.mu.Lock(); e.list = append(e.list, s); e.mu.Unlock() }
func (e *events) get() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.list)
}

// service records its start and stop; fail makes Start fail; atStop runs
// as it stops.
type service struct {
	name   string
	ev     *events
	fail   error
	atStop func()
}

func (s *service) Start(context.Context) error {
	if s.fail != nil {
		return s.fail
	}
	s.ev.add("start " + s.name)
	return nil
}

func (s *service) Stop() {
	if s.atStop != nil {
		s.atStop()
	}
	s.ev.add("stop " + s.name)
}

type noopArgs struct{}

func (noopArgs) Kind() string { return "host_test.noop" }

type noopWorker struct{ river.WorkerDefaults[noopArgs] }

func (noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }

// setup builds a host on a fresh database with workers and the given
// handler and services mounted.
func setup(t *testing.T, handler http.Handler, p host.Parts) *host.Host {
	t.Helper()
	h, err := host.New(context.Background(), host.Config{Name: "test", Addr: "127.0.0.1:0", DatabaseURL: dbtest.URL(t)})
	require.NoError(t, err)
	workers := river.NewWorkers()
	river.AddWorker(workers, noopWorker{})
	p.Workers, err = h.River(&river.Config{Schema: migrations.RiverSchema, Workers: workers,
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 1}}})
	require.NoError(t, err)
	p.Handler = handler
	h.Mount(p)
	return h
}

// TestStopDrainsThenStopsInReverse: Stop runs the shutdown hooks as HTTP
// shutdown begins, waits for the request in flight, then stops the
// services in reverse while the pool still answers, and closes the pool
// last.
func TestStopDrainsThenStopsInReverse(t *testing.T) {
	t.Parallel()
	ev := &events{}
	entered, shutdown := make(chan struct{}), make(chan struct{})
	var h *host.Host
	poolAnswers := func() {
		if h.Pool().Ping(context.Background()) == nil {
			ev.add("pool answers")
		}
	}
	h = setup(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(entered)
		<-shutdown // held open like a listen stream, until shutdown ends it
		ev.add("request done")
		w.WriteHeader(http.StatusNoContent)
	}), host.Parts{
		Services:   []host.Service{&service{name: "a", ev: ev}, &service{name: "b", ev: ev, atStop: poolAnswers}},
		OnShutdown: []func(){func() { ev.add("shutdown hook"); close(shutdown) }},
	})
	ctx := context.Background()
	require.NoError(t, h.Start(ctx))
	require.NoError(t, h.Ready(ctx))
	code := make(chan int, 1)
	go func() {
		resp, err := http.Get(h.URL() + "/")
		if err != nil {
			code <- 0
			return
		}
		resp.Body.Close()
		code <- resp.StatusCode
	}()
	<-entered
	require.NoError(t, h.Stop(ctx))
	require.Equal(t, http.StatusNoContent, <-code, "the request in flight finished")
	require.Equal(t, []string{"start a", "start b", "shutdown hook", "request done", "pool answers", "stop b", "stop a"}, ev.get())
	require.ErrorContains(t, h.Ready(ctx), "shutting down")
	require.Error(t, h.Pool().Ping(ctx), "the pool is closed")
}

// TestFailedStartUndoesAndReleases: a service that fails to start stops
// those started before it, in reverse, at once; Run then releases the
// listener and the pool.
func TestFailedStartUndoesAndReleases(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	failing := func(ev *events) host.Parts {
		return host.Parts{Services: []host.Service{&service{name: "a", ev: ev}, &service{name: "b", ev: ev}, &service{name: "c", ev: ev, fail: boom}}}
	}
	ctx := context.Background()

	ev := &events{}
	h := setup(t, http.NotFoundHandler(), failing(ev))
	require.ErrorIs(t, h.Start(ctx), boom)
	require.Equal(t, []string{"start a", "start b", "stop b", "stop a"}, ev.get(), "Start undid what it started")
	require.NoError(t, h.Stop(ctx))
	require.Len(t, ev.get(), 4, "each started service stopped once")

	ev = &events{}
	h = setup(t, http.NotFoundHandler(), failing(ev))
	addr := h.Addr()
	require.ErrorIs(t, h.Run(ctx, nil), boom)
	require.Equal(t, []string{"start a", "start b", "stop b", "stop a"}, ev.get())
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err, "the listen address is free again")
	ln.Close()
	require.Error(t, h.Pool().Ping(ctx), "the pool is closed")
}

// TestRunReloadsUntilCancelled: Run calls Reload for every value on the
// reload channel, is ready while it serves, and stops when ctx ends.
func TestRunReloadsUntilCancelled(t *testing.T) {
	t.Parallel()
	reloaded := make(chan struct{})
	h := setup(t, http.NotFoundHandler(), host.Parts{Reload: func() { reloaded <- struct{}{} }})
	require.ErrorContains(t, h.Ready(context.Background()), "starting")
	ctx, cancel := context.WithCancel(context.Background())
	reload := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx, reload) }()
	for range 2 {
		reload <- struct{}{}
		select {
		case <-reloaded:
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not reload")
		}
	}
	require.NoError(t, h.Ready(ctx))
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	require.Error(t, h.Pool().Ping(context.Background()), "the pool is closed")
}

// TestCloseReleasesAnUnstartedHost: a process that fails to build closes
// its host, freeing the address.
func TestCloseReleasesAnUnstartedHost(t *testing.T) {
	t.Parallel()
	h, err := host.New(context.Background(), host.Config{Name: "test", Addr: "127.0.0.1:0", DatabaseURL: dbtest.URL(t)})
	require.NoError(t, err)
	addr := h.Addr()
	h.Close()
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err, "the listen address is free again")
	ln.Close()
}

// TestServerBoundsRequests: the host's server refuses oversized headers and
// closes a connection that never finishes its header (slowloris), whatever
// the handler.
func TestServerBoundsRequests(t *testing.T) {
	t.Parallel()
	h := setup(t, http.NotFoundHandler(), host.Parts{})
	ctx := context.Background()
	require.NoError(t, h.Start(ctx))
	t.Cleanup(func() { _ = h.Stop(ctx) })

	// net/http answers 431 and then closes with the rest of the header
	// unread, which resets the connection: a client that had not read the
	// answer by then sees the reset instead. A reset is tried again; any
	// other answer fails.
	got431 := false
	for range 5 {
		req, err := http.NewRequest(http.MethodGet, h.URL()+"/", nil)
		require.NoError(t, err)
		req.Header.Set("X-Big", strings.Repeat("a", 64<<10))
		resp, err := http.DefaultClient.Do(req)
		if err != nil && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
			continue
		}
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)
		got431 = true
		break
	}
	require.True(t, got431, "an oversized header is answered 431")

	conn, err := net.Dial("tcp", h.Addr())
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n"))
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(20*time.Second)))
	_, err = io.ReadAll(conn)
	require.NoError(t, err, "the server closed the connection (a read deadline error means it kept waiting)")
}

// blocking is a service whose Start waits for its context, as River's does
// while it connects.
type blocking struct{ started chan struct{} }

func (b *blocking) Start(ctx context.Context) error {
	close(b.started)
	<-ctx.Done()
	return ctx.Err()
}
func (b *blocking) Stop() {}

// TestRunCancelledWhileStartingIsAStop: a signal that arrives while the
// process is still starting (arapd dev's front-end starts after its
// backend has said so) stops it cleanly: Run returns no error, so the
// process exits 0, and everything is released.
func TestRunCancelledWhileStartingIsAStop(t *testing.T) {
	t.Parallel()
	b := &blocking{started: make(chan struct{})}
	h := setup(t, http.NotFoundHandler(), host.Parts{Services: []host.Service{b}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx, nil) }()
	<-b.started
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	require.Error(t, h.Pool().Ping(context.Background()), "the pool is closed")
}
