package arap_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/internal/announce"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dev"
)

// follow reads a change stream in the background: its events on the
// returned channel, and why it ended on the other.
func follow(t *testing.T, c *arapclient.Client) (<-chan arapclient.Change, <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	events, ended := make(chan arapclient.Change, 64), make(chan error, 1)
	go func() { ended <- c.Changes(ctx, func(ch arapclient.Change) { events <- ch }) }()
	return events, ended
}

func next(t *testing.T, events <-chan arapclient.Change) arapclient.Change {
	t.Helper()
	select {
	case ch := <-events:
		return ch
	case <-time.After(time.Minute):
		t.Fatal("no event on the change stream")
	}
	return arapclient.Change{}
}

// TestDecisionChangesAcrossReplicas: a front-end's change stream at one
// replica hears every change made through another (attributes, the
// directory, a policy reload, a client revoked) once it has said hello,
// and ends after the change that revokes its own client; a revoked client
// is refused a new one.
func TestDecisionChangesAcrossReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := backendtest.Start(t, backendtest.Options{})
	b := backendtest.Start(t, backendtest.Options{Join: a})
	_, token, err := a.Backend.Clients().Create(ctx, clients.New{Name: "second-pep", Scopes: []string{clients.ScopeEvaluate}, Kind: clients.KindAutomation}, "test")
	require.NoError(t, err)
	pepAtB := &arapclient.Client{BaseURL: b.URL, Token: token}

	// The PDP marks an always-allowed call cacheable, and the mark is in
	// the published contract (the proxy checks the response).
	d, err := (&arapclient.Client{BaseURL: b.URL, Token: dev.PEPToken}).Evaluate(ctx, authzen.EvaluationRequest{
		Subject: authzen.Object{"type": "user", "id": "alice"}, Action: authzen.Object{"name": "tools/call"},
		Resource: authzen.Object{"type": "mcp_tool", "id": "get_balance", "properties": map[string]any{"arguments": map[string]any{}}}})
	require.NoError(t, err)
	require.True(t, d.Decision)
	require.Equal(t, time.Minute, d.Cacheable())

	events, ended := follow(t, pepAtB)
	hello := next(t, events)
	require.True(t, hello.Hello)
	require.Positive(t, hello.Keepalive)
	require.GreaterOrEqual(t, hello.Settle, time.Second, "the attributes' snapshot may be a second old")

	require.NoError(t, a.Backend.Attributes().Set(ctx, "risk", "high", "test", nil))
	ch := next(t, events)
	require.Equal(t, "attributes", ch.Kind)
	require.Greater(t, ch.Epoch, hello.Epoch)

	require.NoError(t, a.Backend.Directory().AddMember(ctx, "treasury", "alice", "test"))
	require.Equal(t, "directory", next(t, events).Kind)

	require.NoError(t, a.Backend.Reload())
	require.Equal(t, "policy", next(t, events).Kind)

	_, err = a.Backend.Clients().Revoke(ctx, "dev-itsm", "test")
	require.NoError(t, err)
	require.Equal(t, "client", next(t, events).Kind)
	select {
	case err := <-ended:
		t.Fatalf("another client's revocation ended the stream: %v", err)
	case <-time.After(200 * time.Millisecond):
	}

	_, err = a.Backend.Clients().Revoke(ctx, "second-pep", "test")
	require.NoError(t, err)
	require.Equal(t, "client", next(t, events).Kind)
	select {
	case <-ended:
	case <-time.After(time.Minute):
		t.Fatal("the stream of a revoked client did not end")
	}
	// Refused at once, though the replica may remember the token for
	// clients.CacheTTL.
	refusedCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = pepAtB.Changes(refusedCtx, func(arapclient.Change) { t.Error("a revoked client's stream said something") })
	var pe *arapclient.ProblemError
	require.True(t, errors.As(err, &pe), "%v", err)
	require.Equal(t, http.StatusUnauthorized, pe.Status)
}

// TestDecisionChangesEndWhenNotHeard: a replica whose listening connection
// is lost ends its streams (a change made meanwhile would reach nobody) and
// serves new ones once it listens again; one shutting down ends them and
// refuses new ones.
func TestDecisionChangesEndWhenNotHeard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := backendtest.Start(t, backendtest.Options{})
	pep := &arapclient.Client{BaseURL: env.URL, Token: dev.PEPToken}
	events, ended := follow(t, pep)
	require.True(t, next(t, events).Hello)
	var killed bool
	require.NoError(t, env.Backend.Pool().QueryRow(ctx, `SELECT coalesce(bool_or(pg_terminate_backend(pid)), false) FROM pg_stat_activity
		WHERE application_name = $1 AND datname = current_database()`, announce.Listener).Scan(&killed))
	require.True(t, killed, "no listening connection to end")
	select {
	case <-ended:
	case <-time.After(time.Minute):
		t.Fatal("the stream went on after its replica stopped hearing changes")
	}
	// The listener connects again by itself; a new stream says hello then
	// (until then it is refused: 503).
	deadline := time.Now().Add(time.Minute)
	for {
		events, ended = follow(t, pep)
		var hello bool
		select {
		case ch := <-events:
			hello = ch.Hello
		case err := <-ended:
			require.True(t, arapclient.IsProblem(err, authzen.ProblemUnavailable), "%v", err)
		}
		if hello {
			break
		}
		require.True(t, time.Now().Before(deadline), "no stream was served after the listener was lost")
		time.Sleep(50 * time.Millisecond)
	}

	env.Backend.Changes().End()
	select {
	case <-ended:
	case <-time.After(time.Minute):
		t.Fatal("the stream did not end")
	}
	refusedCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := pep.Changes(refusedCtx, func(arapclient.Change) { t.Error("a stream was served while the replica does not hear changes") })
	require.True(t, arapclient.IsProblem(err, authzen.ProblemUnavailable), "%v", err)
}

// TestDecisionChangesNeedEvaluate: the change stream is the evaluate
// scope's, like the evaluations whose reuse it governs: no token is 401, a
// client without the scope (an ITSM system, a resolver) is 403
// insufficient_scope, and neither gets a hello.
func TestDecisionChangesNeedEvaluate(t *testing.T) {
	t.Parallel()
	env := backendtest.Start(t, backendtest.Options{})
	for _, tc := range []struct {
		token  string
		status int
		code   string
	}{
		{"", http.StatusUnauthorized, authzen.ProblemUnauthorized},
		{dev.ITSMToken, http.StatusForbidden, authzen.ProblemInsufficientScope},
		{dev.ResolverToken, http.StatusForbidden, authzen.ProblemInsufficientScope},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := (&arapclient.Client{BaseURL: env.URL, Token: tc.token}).Changes(ctx, func(arapclient.Change) {
			t.Errorf("a stream was served to %q", tc.token)
		})
		cancel()
		var pe *arapclient.ProblemError
		require.True(t, errors.As(err, &pe), "%q: %v", tc.token, err)
		require.Equal(t, tc.status, pe.Status, "%q", tc.token)
		require.True(t, arapclient.IsProblem(err, tc.code), "%q: %v", tc.token, err)
	}
}
