package pep_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
)

// upstream is a tool source standing in for an upstream MCP server: one
// tool, drop_table (upstream "db", tool "drop" there, marked destructive),
// whose definition a test changes while a call waits, and whose Run counts
// its calls and returns what the test says.
type upstream struct {
	mu    sync.Mutex
	tools []pep.Tool
	calls atomic.Int64
	// fail, when set, is what Run returns instead of running.
	fail atomic.Pointer[error]
	// out, when set, is what Run returns when it runs.
	out atomic.Pointer[pep.Output]
}

func newUpstream() *upstream {
	u := &upstream{}
	yes := true
	u.tools = []pep.Tool{{
		Name: "drop_table", Title: "Drop a table", Description: "Drop a database table.",
		InputSchema: map[string]any{"type": "object", "properties": map[string]any{"table": map[string]any{"type": "string", "minLength": 1}},
			"required": []any{"table"}, "additionalProperties": false},
		OutputSchema: map[string]any{"type": "object", "properties": map[string]any{"dropped": map[string]any{"type": "string"}}},
		Annotations:  &sdk.ToolAnnotations{DestructiveHint: &yes, IdempotentHint: true},
		Upstream:     "db", UpstreamTool: "drop",
	}}
	u.tools[0].Run = u.run
	return u
}

func (u *upstream) Tools() []pep.Tool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]pep.Tool(nil), u.tools...)
}

// change edits tool i's definition, as its server would.
func (u *upstream) change(i int, f func(*pep.Tool)) {
	u.mu.Lock()
	defer u.mu.Unlock()
	f(&u.tools[i])
	u.tools[i].Digest = ""
}

func (u *upstream) run(_ context.Context, x pep.Invocation) (pep.Output, error) {
	u.calls.Add(1)
	if err := u.fail.Load(); err != nil {
		return pep.Output{}, *err
	}
	if out := u.out.Load(); out != nil {
		return *out, nil
	}
	table, _ := x.Args["table"].(string)
	return pep.Output{Text: "Dropped " + table + ".", Structured: map[string]any{"dropped": table}}, nil
}

// drop calls drop_table as alice and returns the task id.
func (p *stack) drop(t *testing.T, table string) string {
	t.Helper()
	r, err := p.alice.CallTool(context.Background(), "drop_table", map[string]any{"table": table}, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeTask, r.ResultType, "%s", r.Raw)
	return r.Task.TaskID
}

// approveAndAdvance approves the task's request as the dev ITSM system and
// advances the task once.
func (p *stack) approveAndAdvance(t *testing.T, id string) {
	t.Helper()
	p.approve(t, p.request(t, id), time.Time{})
	p.advance(t, id)
}

// TestDestructiveToolNeedsApproval: the dev policy's destructive_tools rule
// makes any tool marked destructiveHint: true requestable, through the real
// PDP, because the evaluation carries the tool's upstream, upstream tool and
// annotations beside its arguments; the approved call runs exactly once.
func TestDestructiveToolNeedsApproval(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := newUpstream()
	p := newPEP(t, pepOptions{sources: []pep.ToolSource{u}})
	id := p.drop(t, "orders")
	require.Zero(t, u.calls.Load(), "a requestable denial never runs the tool")

	var resource map[string]any
	require.NoError(t, p.env.Pool.QueryRow(ctx, `SELECT resource FROM arap.requests WHERE id = $1`, p.request(t, id)).Scan(&resource))
	require.Equal(t, map[string]any{"type": "mcp_tool", "id": "drop_table", "properties": map[string]any{
		"arguments": map[string]any{"table": "orders"}, "upstream": "db", "upstream_tool": "drop",
		"annotations": map[string]any{"destructiveHint": true, "idempotentHint": true, "readOnlyHint": false}}}, resource)

	p.approveAndAdvance(t, id)
	d := p.get(t, id)
	require.Equal(t, pep.ApprovedExecuted, disposition(t, d))
	require.Equal(t, int64(1), u.calls.Load())
	var res sdk.CallToolResult
	require.NoError(t, json.Unmarshal(d.Result, &res))
	require.Equal(t, map[string]any{"dropped": "orders"}, res.StructuredContent)
	p.advance(t, id)
	require.Equal(t, int64(1), u.calls.Load(), "executed once")

	// The same tool not marked destructive falls through to the default
	// deny: the rule reads the hint, not the name.
	no := false
	u.change(0, func(t *pep.Tool) { t.Annotations = &sdk.ToolAnnotations{DestructiveHint: &no} })
	r, err := p.alice.CallTool(ctx, "drop_table", map[string]any{"table": "orders"}, nil)
	require.NoError(t, err)
	require.True(t, r.IsError, "%s", r.Raw)
	require.Contains(t, string(r.Raw), pep.RemediationUnavailable)
	require.Equal(t, int64(1), u.calls.Load())
}

// TestToolChangedWhilePending: a tool whose definition changes while its
// call waits for approval does not run on that approval, whichever part
// changed (description, input schema, annotations) and whenever the change
// is seen: before re-evaluation (no new request is opened for it either) or
// between re-evaluation and the claim. The task ends denied-not-executed,
// saying the tool changed.
func TestToolChangedWhilePending(t *testing.T) {
	t.Parallel()
	changes := map[string]func(*pep.Tool){
		"description": func(t *pep.Tool) { t.Description = "Drop a database table, and its backups." },
		"schema": func(t *pep.Tool) {
			t.InputSchema = map[string]any{"type": "object", "properties": map[string]any{"table": map[string]any{"type": "string"},
				"cascade": map[string]any{"type": "boolean"}}, "required": []any{"table"}}
		},
		"annotations": func(t *pep.Tool) {
			yes := true
			t.Annotations = &sdk.ToolAnnotations{DestructiveHint: &yes, OpenWorldHint: &yes}
		},
	}
	for what, change := range changes {
		for _, when := range []string{"before-reevaluation", "at-claim"} {
			t.Run(what+"/"+when, func(t *testing.T) {
				t.Parallel()
				u := newUpstream()
				p := newPEP(t, pepOptions{sources: []pep.ToolSource{u}})
				id := p.drop(t, "orders")
				p.approve(t, p.request(t, id), time.Time{})
				reevaluated := atomic.Bool{}
				if when == "before-reevaluation" {
					u.change(0, change)
				} else {
					// Changed once the PDP has been asked (with the old
					// definition) and before the claim.
					p.onBackend(func(r *http.Request, body []byte) {
						if reevaluation(r, body) && reevaluated.CompareAndSwap(false, true) {
							u.change(0, change)
						}
					})
				}
				p.advance(t, id)
				d := p.get(t, id)
				require.Equal(t, pep.DeniedNotExecuted, disposition(t, d))
				require.Contains(t, string(d.Result), "changed after the call was approved")
				require.Zero(t, u.calls.Load(), "not executed")
				require.Equal(t, when == "at-claim", reevaluated.Load())
				require.NotContains(t, p.trail(t, id), pep.AuditClaimed)
				p.advance(t, id)
				require.Zero(t, u.calls.Load())
			})
		}
	}
	t.Run("unchanged", func(t *testing.T) {
		t.Parallel()
		u := newUpstream()
		p := newPEP(t, pepOptions{sources: []pep.ToolSource{u}})
		id := p.drop(t, "orders")
		u.change(0, func(*pep.Tool) {}) // the same definition, its digest recomputed
		p.approveAndAdvance(t, id)
		require.Equal(t, pep.ApprovedExecuted, disposition(t, p.get(t, id)))
		require.Equal(t, int64(1), u.calls.Load())
	})
	t.Run("gone", func(t *testing.T) {
		t.Parallel()
		u := newUpstream()
		p := newPEP(t, pepOptions{sources: []pep.ToolSource{u}})
		id := p.drop(t, "orders")
		u.change(0, func(t *pep.Tool) { t.Name = "drop_table_v2" })
		p.approveAndAdvance(t, id)
		d := p.get(t, id)
		require.Equal(t, pep.DeniedNotExecuted, disposition(t, d))
		require.Contains(t, string(d.Result), "no longer offered")
		require.Zero(t, u.calls.Load())
	})
}

// TestStoredArgumentsCheckedAgainstCurrentSchema: at the claim the stored
// arguments are validated against the tool's current input schema. A task
// opened before tool digests were recorded (tool_digest NULL) has only
// this check: a schema its arguments no longer fit stops it.
func TestStoredArgumentsCheckedAgainstCurrentSchema(t *testing.T) {
	t.Parallel()
	u := newUpstream()
	p := newPEP(t, pepOptions{sources: []pep.ToolSource{u}})
	id := p.drop(t, "orders")
	_, err := p.db.Exec(context.Background(), `UPDATE pep.approval_tasks SET tool_digest = NULL WHERE task_id = $1`, id)
	require.NoError(t, err)
	u.change(0, func(t *pep.Tool) {
		t.InputSchema = map[string]any{"type": "object", "properties": map[string]any{"table": map[string]any{"type": "string", "maxLength": 3}}}
	})
	p.approveAndAdvance(t, id)
	d := p.get(t, id)
	require.Equal(t, pep.DeniedNotExecuted, disposition(t, d))
	require.Contains(t, string(d.Result), "no longer fit the tool's current input schema")
	require.Zero(t, u.calls.Load())
}

// TestUpstreamFailureAfterClaim: a run whose upstream may have received the
// call but whose response was lost ends outcome-unknown at once and is
// never sent again; one that certainly did not reach the tool ends failed,
// saying which upstream and what happened, and is not sent again either.
// Neither shows the cause (which may hold the upstream's URL).
func TestUpstreamFailureAfterClaim(t *testing.T) {
	t.Parallel()
	const secret = "https://user:hunter2@db.internal:8443/mcp"
	cases := map[bool]string{true: "the response was lost", false: "connection refused"}
	for maybeRan, what := range cases {
		t.Run(what, func(t *testing.T) {
			t.Parallel()
			u := newUpstream()
			var err error = &pep.UpstreamError{Upstream: "db", Message: what, MaybeRan: maybeRan, Err: errors.New("post " + secret + ": EOF")}
			u.fail.Store(&err)
			p := newPEP(t, pepOptions{sources: []pep.ToolSource{u}})
			id := p.drop(t, "orders")
			p.approveAndAdvance(t, id)
			require.Equal(t, int64(1), u.calls.Load())
			d := p.task(t, id)
			raw, merr := json.Marshal(d)
			require.NoError(t, merr)
			require.NotContains(t, string(raw), "hunter2")
			require.NotContains(t, string(raw), "db.internal")
			if maybeRan {
				require.Equal(t, pep.OutcomeUnknown, disposition(t, d))
				require.Contains(t, string(d.Result), "upstream db: the response was lost; the tool may have run")
				require.Contains(t, p.trail(t, id), pep.AuditOutcomeUnknown)
			} else {
				require.Equal(t, tasks.Failed, d.Status)
				require.NotNil(t, d.Error)
				require.Equal(t, "upstream db: connection refused; the tool did not run", d.Error.Message)
				require.Contains(t, p.trail(t, id), pep.AuditNotRun)
			}
			// Nothing sends it again: not another look, not the reaper.
			u.fail.Store(nil)
			p.advance(t, id)
			p.offset.Store(int64(time.Hour))
			p.advance(t, id)
			require.Equal(t, int64(1), u.calls.Load(), "sent exactly once")
			p.requireIntact(t)
		})
	}
}

// TestUpstreamToolErrorAfterApproval: an upstream tool that ran after
// approval and reported an error (isError) ends execution-error, the
// upstream's own content after the gate's sentence; it ran once.
func TestUpstreamToolErrorAfterApproval(t *testing.T) {
	t.Parallel()
	u := newUpstream()
	u.out.Store(&pep.Output{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: "table orders is locked"}}})
	p := newPEP(t, pepOptions{sources: []pep.ToolSource{u}})
	id := p.drop(t, "orders")
	p.approveAndAdvance(t, id)
	d := p.get(t, id)
	require.Equal(t, pep.ExecutionError, disposition(t, d))
	var res sdk.CallToolResult
	require.NoError(t, json.Unmarshal(d.Result, &res))
	require.True(t, res.IsError)
	require.Len(t, res.Content, 2)
	require.Contains(t, res.Content[0].(*sdk.TextContent).Text, "ran after approval but reported an error")
	require.Equal(t, "table orders is locked", res.Content[1].(*sdk.TextContent).Text)
	require.Equal(t, int64(1), u.calls.Load())
}

// allowDrop adds, to the dev policy, a rule that allows drop_table
// outright (for the calls that run at once, without a task).
var allowDrop = append(dev.SeedPolicy(), []byte(`
  - name: drop_allowed_in_test
    match: {action: tools/call, resource_type: mcp_tool, resource_id: drop_table}
    effect: allow
`)...)

// TestDirectCallUpstreamErrors: an allowed call runs at once; an upstream's
// tool error comes back as a tool error with the upstream's content intact;
// an upstream that could not be reached is a JSON-RPC error naming the
// upstream and what happened, without its URL.
func TestDirectCallUpstreamErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := newUpstream()
	// The destructive rule comes first in the dev policy: drop the hint so
	// the allow rule decides.
	u.change(0, func(t *pep.Tool) { t.Annotations = nil })
	p := newPEP(t, pepOptions{policy: allowDrop, sources: []pep.ToolSource{u}})

	r, err := p.alice.CallTool(ctx, "drop_table", map[string]any{"table": "orders"}, nil)
	require.NoError(t, err)
	require.False(t, r.IsError, "%s", r.Raw)
	require.JSONEq(t, `{"content":[{"type":"text","text":"Dropped orders."}],"structuredContent":{"dropped":"orders"},"resultType":"complete"}`, withoutMeta(t, r.Raw))

	u.out.Store(&pep.Output{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: "table orders is locked"}}})
	r, err = p.alice.CallTool(ctx, "drop_table", map[string]any{"table": "orders"}, nil)
	require.NoError(t, err)
	require.True(t, r.IsError)
	require.JSONEq(t, `{"content":[{"type":"text","text":"table orders is locked"}],"isError":true,"resultType":"complete"}`, withoutMeta(t, r.Raw))

	var cause error = &pep.UpstreamError{Upstream: "db", Message: "timed out after 30s", MaybeRan: true, Err: errors.New("https://db.internal/mcp: deadline")}
	u.fail.Store(&cause)
	_, err = p.alice.CallTool(ctx, "drop_table", map[string]any{"table": "orders"}, nil)
	var rpc *tasks.RPCError
	require.ErrorAs(t, err, &rpc)
	require.Equal(t, "upstream db: timed out after 30s; the tool may have run", rpc.Message)
	require.Equal(t, int64(3), u.calls.Load())
}

// withoutMeta is a result without its _meta (the SDK's serverInfo).
func withoutMeta(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(raw, &m))
	delete(m, "_meta")
	out, err := json.Marshal(m)
	require.NoError(t, err)
	return string(out)
}

// TestToolsListFollowsSources: tools/list shows each source's tools with
// title, schemas and annotations as the source gives them, the demo tools
// as before, and follows the sources: a changed definition is listed
// changed, a tool gone is gone.
func TestToolsListFollowsSources(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := newUpstream()
	p := newPEP(t, pepOptions{sources: []pep.ToolSource{u}})
	list := func() map[string]json.RawMessage {
		resp, err := p.alice.Call(ctx, "tools/list", "", nil)
		require.NoError(t, err)
		require.Nil(t, resp.Error)
		var out struct {
			Tools []json.RawMessage `json:"tools"`
		}
		require.NoError(t, json.Unmarshal(resp.Result, &out))
		byName := map[string]json.RawMessage{}
		for _, raw := range out.Tools {
			var n struct{ Name string }
			require.NoError(t, json.Unmarshal(raw, &n))
			byName[n.Name] = raw
		}
		return byName
	}
	got := list()
	require.JSONEq(t, `{"name":"drop_table","title":"Drop a table","description":"Drop a database table.",
		"inputSchema":{"type":"object","properties":{"table":{"type":"string","minLength":1}},"required":["table"],"additionalProperties":false},
		"outputSchema":{"type":"object","properties":{"dropped":{"type":"string"}}},
		"annotations":{"destructiveHint":true,"idempotentHint":true,"readOnlyHint":false}}`, string(got["drop_table"]))
	require.JSONEq(t, `{"name":"delete_repository","description":"Delete a source repository. Needs two platform approvals.",
		"inputSchema":{"type":"object","properties":{"repo":{"type":"string","minLength":1,"maxLength":100}},"required":["repo"],"additionalProperties":false}}`,
		string(got["delete_repository"]))
	require.Len(t, got, 6)

	u.change(0, func(t *pep.Tool) { t.Description = "Drop a table (v2)." })
	require.Contains(t, string(list()["drop_table"]), "Drop a table (v2).")
	u.change(0, func(t *pep.Tool) { t.Name = "drop_table_v2" })
	got = list()
	require.NotContains(t, got, "drop_table")
	require.Contains(t, got, "drop_table_v2")
}

// TestNameCollisionRefusedAtStartup: two sources offering the same exposed
// name is a configuration error, refused when the gate is built.
func TestNameCollisionRefusedAtStartup(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	u := newUpstream()
	u.change(0, func(t *pep.Tool) { t.Name = "wire_transfer" })
	_, err := newGate(db, u)
	require.ErrorContains(t, err, `tool "wire_transfer" is offered by both upstream demo and upstream db`)

	u.change(0, func(t *pep.Tool) { t.Name = "drop_table" })
	g, err := newGate(db, u, u)
	require.ErrorContains(t, err, `tool "drop_table" is offered by both upstream db and upstream db`)
	require.Nil(t, g)
	g, err = newGate(db, u)
	require.NoError(t, err)
	g.Stop()
}

func newGate(db *pgxpool.Pool, sources ...pep.ToolSource) (*pep.Gate, error) {
	return pep.NewGate(pep.Config{DB: db, Backend: &arapclient.Client{BaseURL: "http://127.0.0.1:1"}, MasterKey: make([]byte, 32),
		Tools: pep.DemoTools(), Sources: sources})
}
