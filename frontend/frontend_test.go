package frontend_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/frontend"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// TestStopEndsListenStreams: a listen stream never ends by itself, and
// HTTP shutdown waits for open requests; Stop ends the streams first (each
// gets its listen result), so it drains well within its deadline.
func TestStopEndsListenStreams(t *testing.T) {
	ctx := context.Background()
	f, err := frontend.New(ctx, frontend.Config{Addr: "127.0.0.1:0", DatabaseURL: dbtest.URL(t), MasterKey: make([]byte, 32), Tools: pep.DemoTools(),
		BackendURL: "http://127.0.0.1:1", BackendToken: "unused"})
	require.NoError(t, err)
	p := pep.Principal{SubjectType: "user", SubjectID: "alice", ActorID: "agent:demo"}
	require.NoError(t, f.Gate().Callers().Create(ctx, "alice-agent", "alice-token-0123", p))
	task := &tasks.Task{ID: tasks.NewID(), Principal: p.Key(), Kind: pep.KindApproval, PollIntervalMs: 1000}
	require.NoError(t, pgx.BeginFunc(ctx, f.Pool(), func(tx pgx.Tx) error { return f.Gate().Tasks().CreateTx(ctx, tx, task) }))
	require.NoError(t, f.Start(ctx))

	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 9, "method": tasks.MethodListen, "params": map[string]any{
		"notifications": map[string]any{"taskIds": []string{task.ID}},
		"_meta": map[string]any{tasks.MetaProtocolVersion: tasks.ProtocolVersion,
			tasks.MetaClientCapabilities: map[string]any{"extensions": map[string]any{tasks.ExtensionID: map[string]any{}}}}}})
	req, _ := http.NewRequest(http.MethodPost, f.URL()+pep.PathMCP, strings.NewReader(string(body)))
	req.Header.Set("Authorization", "Bearer alice-token-0123")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set(tasks.HeaderProtocolVersion, tasks.ProtocolVersion)
	req.Header.Set(tasks.HeaderMethod, tasks.MethodListen)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				lines <- d
			}
		}
	}()
	require.Contains(t, <-lines, tasks.NotificationAcknowledged)
	require.Contains(t, <-lines, `"status":"working"`)

	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, f.Stop(stopCtx), "HTTP drained: no stream held it open")
	var rest []string
	for l := range lines {
		rest = append(rest, l)
	}
	require.Len(t, rest, 1, "the stream ended with its result")
	require.Contains(t, rest[0], `"id":9`)
	require.Contains(t, rest[0], `"resultType":"complete"`)
}

// TestSourceNameCollisionRefused: a source offering a name the demo tools
// (or another source) already offer is refused at startup, naming both.
func TestSourceNameCollisionRefused(t *testing.T) {
	t.Parallel()
	clash := pep.StaticTools{{Name: "wire_transfer", Upstream: "bank", InputSchema: map[string]any{"type": "object"}}}
	_, err := frontend.New(context.Background(), frontend.Config{Addr: "127.0.0.1:0", DatabaseURL: dbtest.URL(t), MasterKey: make([]byte, 32), Tools: pep.DemoTools(),
		BackendURL: "http://127.0.0.1:1", BackendToken: "unused", Sources: []pep.ToolSource{clash}})
	require.ErrorContains(t, err, `tool "wire_transfer" is offered by both upstream demo and upstream bank`)
}

// TestNoToolsNoStart (issue 38): the demo tools are never a default. A
// front-end given no tools, no upstreams and no fixtures does not start,
// and says what to give it; the demo tools are offered only when asked
// for (arapd dev, --demo-tools), and an upstreams file alone offers no
// demo tool.
func TestNoToolsNoStart(t *testing.T) {
	t.Parallel()
	_, err := frontend.New(context.Background(), frontend.Config{Addr: "127.0.0.1:0", DatabaseURL: dbtest.URL(t), MasterKey: make([]byte, 32),
		BackendURL: "http://127.0.0.1:1", BackendToken: "unused"})
	require.ErrorIs(t, err, frontend.ErrNoTools)
	require.ErrorContains(t, err, "--upstreams")
	require.ErrorContains(t, err, "--demo-tools")

	file := filepath.Join(t.TempDir(), "upstreams.yaml")
	require.NoError(t, os.WriteFile(file, []byte("upstreams: []\n"), 0o600))
	f, err := frontend.New(context.Background(), frontend.Config{Addr: "127.0.0.1:0", DatabaseURL: dbtest.URL(t), MasterKey: make([]byte, 32),
		BackendURL: "http://127.0.0.1:1", BackendToken: "unused", Upstreams: file})
	require.NoError(t, err)
	ctx := context.Background()
	p := pep.Principal{SubjectType: "user", SubjectID: "alice", ActorID: "agent:demo"}
	require.NoError(t, f.Gate().Callers().Create(ctx, "alice-agent", "alice-token-0123", p))
	require.NoError(t, f.Start(ctx))
	t.Cleanup(func() { _ = f.Stop(context.Background()) })
	tools, _, err := (&tasks.Client{URL: f.URL() + pep.PathMCP, Token: "alice-token-0123"}).ListTools(ctx)
	require.NoError(t, err)
	require.Empty(t, tools, "an upstreams file alone offers no demo tool")
}
