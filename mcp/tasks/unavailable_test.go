package tasks_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/mcp/tasks"
)

// TestMethodsWhileDatabaseDown: a task method whose store fails because
// the database is unavailable answers CodeUnavailable with the wait (at
// HTTP 200: the SDK writes the answer of a dispatched method, and its own
// client reads a JSON-RPC error only from a 2xx or non-transient answer),
// never -32603; a listen stream is refused with 503; once the database is
// back, the task reads again. The client's Wait, started during the
// outage, rides it out.
func TestMethodsWhileDatabaseDown(t *testing.T) {
	db := dbtest.NewPrivate(t)
	pool, err := pgxpool.New(context.Background(), db.URL)
	require.NoError(t, err)
	defer pool.Close()
	store := &tasks.Store{DB: pool}
	task := create(t, store, nil)

	s := sdk.NewServer(&sdk.Implementation{Name: "t", Version: "0"}, nil)
	notifier := tasks.NewNotifier(pool, tasks.ListenConfig{})
	require.NoError(t, notifier.Start(context.Background()))
	defer notifier.Stop()
	ts := &tasks.Server{Store: store, Kinds: map[string]tasks.Kind{}, Notifier: notifier}
	require.NoError(t, ts.Register(s))
	refused := make(chan struct{}, 100) // one per CodeUnavailable answer
	s.AddReceivingMiddleware(func(next sdk.MethodHandler) sdk.MethodHandler {
		return func(ctx context.Context, method string, req sdk.Request) (sdk.Result, error) {
			res, err := next(tasks.WithPrincipal(ctx, task.Principal), method, req)
			if je := (*jsonrpc.Error)(nil); errors.As(err, &je) && je.Code == tasks.CodeUnavailable {
				refused <- struct{}{}
			}
			return res, err
		}
	})
	wrapped := ts.Wrap(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, &sdk.StreamableHTTPOptions{Stateless: true, JSONResponse: true}))
	// The caller's principal, as the front-end's authentication sets it.
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		wrapped.ServeHTTP(w, r.WithContext(tasks.WithPrincipal(r.Context(), task.Principal)))
	})
	getTask := get(`"taskId":"` + task.ID + `"`)
	code, out := post(h, getTask, tasks.MethodGet, task.ID)
	require.Equal(t, http.StatusOK, code)
	require.Nil(t, out["error"], "%v", out)

	db.Stop(t, false)
	for _, m := range []string{tasks.MethodGet, tasks.MethodCancel} {
		body := `{"jsonrpc":"2.0","id":1,"method":"` + m + `","params":{"taskId":"` + task.ID + `",` + meta + `}}`
		code, out = post(h, body, m, task.ID)
		require.Equal(t, http.StatusOK, code)
		e, _ := out["error"].(map[string]any)
		require.NotNil(t, e, "%s: %v", m, out)
		require.EqualValues(t, tasks.CodeUnavailable, e["code"], "%s: %v", m, out)
		require.Equal(t, "temporarily unavailable: the database is unavailable; retry after 2 s", e["message"])
		require.Equal(t, map[string]any{tasks.DataRetryAfter: float64(2)}, e["data"])
	}

	// A listen stream cannot be opened (its task ids cannot be checked):
	// refused before it starts, so with 503 and Retry-After.
	listen := `{"jsonrpc":"2.0","id":3,"method":"subscriptions/listen","params":{"notifications":{"taskIds":["` + task.ID + `"]},` + meta + `}}`
	code, out = post(h, listen, tasks.MethodListen, "")
	require.Equal(t, http.StatusServiceUnavailable, code, "%v", out)
	e, _ := out["error"].(map[string]any)
	require.EqualValues(t, tasks.CodeUnavailable, e["code"], "%v", out)
	require.EqualValues(t, 3, out["id"])

	// The client's Wait waits an outage out: it is answered unavailable,
	// and returns once the task ends after the restart.
	for range 2 {
		<-refused // the two answers above
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	waited := make(chan error, 1)
	var done *tasks.Detailed
	go func() {
		var err error
		done, err = (&tasks.Client{URL: srv.URL}).Wait(context.Background(), task.ID)
		waited <- err
	}()
	<-refused

	db.Start(t)
	require.Eventually(t, func() bool {
		code, out = post(h, getTask, tasks.MethodGet, task.ID)
		return code == http.StatusOK && out["error"] == nil
	}, 30*time.Second, 50*time.Millisecond)
	res, _ := out["result"].(map[string]any)
	require.Equal(t, string(tasks.Working), res["status"], "%v", out)
	_, err = transition(store, task.ID, tasks.Change{To: tasks.Completed, Result: json.RawMessage(`{"content":[]}`)})
	require.NoError(t, err)
	require.NoError(t, <-waited)
	require.Equal(t, tasks.Completed, done.Status)
}
