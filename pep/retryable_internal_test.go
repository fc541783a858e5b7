package pep

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/mcp/tasks"
)

// TestRetryable: an error of an unavailable database that reaches route
// (which the SDK would answer with the driver's text, naming the server)
// becomes tasks.Unavailable; one with a JSON-RPC code passes unchanged;
// any other is an internal error that says nothing of its cause.
func TestRetryable(t *testing.T) {
	s := &Server{log: slog.New(slog.DiscardHandler)}
	_, down := pgx.Connect(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=5")
	require.Error(t, down)
	var je *jsonrpc.Error
	require.ErrorAs(t, s.retryable("tools/call", down), &je)
	require.Equal(t, int64(tasks.CodeUnavailable), je.Code)
	require.NotContains(t, je.Message, "127.0.0.1")

	other := errors.New(`ERROR: relation "pep.approval_tasks" does not exist (SQLSTATE 42P01)`)
	require.ErrorAs(t, s.retryable("tools/call", other), &je)
	require.Equal(t, int64(tasks.CodeInternalError), je.Code)
	require.Equal(t, "internal error", je.Message)
	own := rpcError(tasks.CodeInvalidParams, "bad")
	require.Equal(t, error(own), s.retryable("tools/call", own))
	require.NoError(t, s.retryable("tools/list", nil))
}

// TestBackendUnavailable: the backend's own 503, a proxy's 502 or 504 in
// front of it (found by the chaos run: a replica restarting behind the load
// balancer was answered -32603) and no connection are "unavailable"; its
// definite answers are not.
func TestBackendUnavailable(t *testing.T) {
	for status, want := range map[int]bool{503: true, 502: true, 504: true, 500: false, 400: false, 401: false, 429: false} {
		require.Equal(t, want, backendUnavailable(&arapclient.ProblemError{Status: status}), "%d", status)
	}
	_, err := http.Get("http://127.0.0.1:1/")
	require.True(t, backendUnavailable(err), "refused: %v", err)
	require.False(t, backendUnavailable(errors.New("something else")))
}

// TestBackoff: the wait before a retry is 200ms per attempt, or the
// backend's Retry-After when longer, never over a second (a caller waits).
func TestBackoff(t *testing.T) {
	pe := func(s int) error { return &arapclient.ProblemError{Status: 503, RetryAfter: s} }
	require.Equal(t, 200*time.Millisecond, backoff(1, errors.New("reset")))
	require.Equal(t, 400*time.Millisecond, backoff(2, pe(0)))
	require.Equal(t, time.Second, backoff(1, pe(1)))
	require.Equal(t, time.Second, backoff(1, pe(2)), "capped")
}

// TestSubmitFailureNamesNoEndpoint: a failed submission's error, which the
// task's caller reads, says why in words of its own, never the error's
// text, which names the backend's endpoint (found by the chaos run: a lost
// submission's task showed "Post http://127.0.0.1:…/access/v1/requests").
func TestSubmitFailureNamesNoEndpoint(t *testing.T) {
	_, refused := http.Post("http://127.0.0.1:1/access/v1/requests", "application/json", nil)
	require.Error(t, refused)
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: %w", errUncertain, refused), "the approval service did not confirm it"},
		{refused, "the approval service could not be reached"},
		{&arapclient.ProblemError{Status: 503}, "the approval service could not be reached"},
		{&arapclient.ProblemError{Status: 403, Problem: authzen.Problem{Type: authzen.ProblemPrefix + "forbidden", Detail: "see http://127.0.0.1:8480/x"}}, "the approval service refused it (403 forbidden)"},
		{errors.New("post http://127.0.0.1:8480/access/v1/requests: boom"), "internal error"},
	} {
		got := submitFailure(tc.err)
		require.Equal(t, tc.want, got)
		require.NotContains(t, got, "127.0.0.1")
	}
}
