package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Tasks as MCP 2025-11-25 has them: the core specification's experimental
// tasks utility, which the clients released before the extension speak (the
// TypeScript SDK v1's experimental tasks API, among others). A client of
// that revision asks for a task with params.task on tools/call (requestor
// driven, where the extension is server directed), gets a CreateTaskResult
// {task}, follows it with tasks/get, takes the result with tasks/result, and
// may list and cancel. The store, the kinds and the tasks are the same; only
// the shapes differ. The server says it offers them in its initialize
// result (LegacyCapabilities) and on each tool (taskSupport), for that
// revision only.

// Methods and keys of 2025-11-25's tasks that the extension does not have.
const (
	MethodResult = "tasks/result"
	MethodList   = "tasks/list"
	// MetaRelatedTask ties tasks/result's result to its task.
	MetaRelatedTask = "io.modelcontextprotocol/related-task"
	// LegacyVersion is the revision whose tasks these are.
	LegacyVersion = "2025-11-25"
)

// LegacyCapabilities is capabilities.tasks of an initialize result at
// 2025-11-25: tasks/list, tasks/cancel, and task-augmented tools/call.
func LegacyCapabilities() map[string]any {
	return map[string]any{"list": map[string]any{}, "cancel": map[string]any{}, "requests": map[string]any{"tools": map[string]any{"call": map[string]any{}}}}
}

type legacyKey struct{}

// legacyRequest is what Wrap learned of a request made at 2025-11-25 (its
// MCP-Protocol-Version header): that it is one, and whether a tools/call
// asked for a task.
type legacyRequest struct{ task bool }

// withLegacy marks ctx as a 2025-11-25 request's, one that asked for a task
// when task is set.
func withLegacy(ctx context.Context, task bool) context.Context {
	return context.WithValue(ctx, legacyKey{}, legacyRequest{task: task})
}

// IsLegacy reports whether ctx is a request's made at 2025-11-25.
func IsLegacy(ctx context.Context) bool {
	_, ok := ctx.Value(legacyKey{}).(legacyRequest)
	return ok
}

// LegacyTaskRequested reports whether ctx is a 2025-11-25 tools/call's that
// asked for a task (params.task).
func LegacyTaskRequested(ctx context.Context) bool {
	l, ok := ctx.Value(legacyKey{}).(legacyRequest)
	return ok && l.task
}

// LegacyTask is the Task of 2025-11-25.
type LegacyTask struct {
	TaskID        string `json:"taskId"`
	Status        Status `json:"status"`
	StatusMessage string `json:"statusMessage,omitempty"`
	CreatedAt     string `json:"createdAt"`
	LastUpdatedAt string `json:"lastUpdatedAt"`
	// TTL is in milliseconds; null means unlimited.
	TTL          *int64 `json:"ttl"`
	PollInterval int    `json:"pollInterval,omitempty"`
}

// Legacy renders t as 2025-11-25 shows it.
func (t *Task) Legacy() LegacyTask {
	w := t.Wire()
	return LegacyTask{TaskID: w.TaskID, Status: w.Status, StatusMessage: w.StatusMessage, CreatedAt: w.CreatedAt,
		LastUpdatedAt: w.LastUpdatedAt, TTL: w.TTLMs, PollInterval: w.PollIntervalMs}
}

// LegacyCreateResult is 2025-11-25's CreateTaskResult.
type LegacyCreateResult struct {
	sdk.ResultBase
	Task LegacyTask `json:"task"`
}

// NewLegacyCreateResult renders t as 2025-11-25's CreateTaskResult, with
// extra _meta.
func NewLegacyCreateResult(t *Task, meta map[string]any) *LegacyCreateResult {
	r := &LegacyCreateResult{Task: t.Legacy()}
	r.Meta = merge(t.Meta, meta)
	return r
}

// LegacyTaskResult is the result of tasks/get and tasks/cancel at
// 2025-11-25: the Task itself.
type LegacyTaskResult struct {
	sdk.ResultBase
	LegacyTask
}

// LegacyListResult is the result of tasks/list.
type LegacyListResult struct {
	sdk.ResultBase
	Tasks      []LegacyTask `json:"tasks"`
	NextCursor string       `json:"nextCursor,omitempty"`
}

// PayloadResult is the result of tasks/result: the request's own result (a
// CallToolResult), with the related task in its _meta.
type PayloadResult struct {
	sdk.ResultBase
	raw    json.RawMessage
	taskID string
}

// MarshalJSON writes the stored result with _meta's related task added.
func (r *PayloadResult) MarshalJSON() ([]byte, error) {
	var m map[string]any
	if err := json.Unmarshal(r.raw, &m); err != nil || m == nil {
		m = map[string]any{}
	}
	meta, _ := m["_meta"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	meta[MetaRelatedTask] = map[string]any{"taskId": r.taskID}
	m["_meta"] = meta
	return json.Marshal(m)
}

// ListParams are the params of tasks/list.
type ListParams struct {
	sdk.ParamsBase
	Cursor string `json:"cursor,omitempty"`
}

// legacyOnly refuses a method of 2025-11-25's tasks asked at a revision
// that has the extension instead.
func legacyOnly(ctx context.Context, method string) error {
	if IsLegacy(ctx) {
		return nil
	}
	return &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "method not found: " + method + " (MCP 2025-11-25's tasks; at " + ProtocolVersion + " use " + ExtensionID + ")"}
}

// resultWait bounds how long tasks/result holds a request for a task that
// is not over: less than the server's write timeout. A client asks again.
const resultWait = 45 * time.Second

// result is tasks/result: the task's result once it is over. It waits
// (re-reading the task) while the task is not, up to resultWait.
func (s *Server) result(ctx context.Context, _ *sdk.ServerSession, p *TaskParams) (*PayloadResult, error) {
	if err := legacyOnly(ctx, MethodResult); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(resultWait)
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		t, err := s.Store.GetFor(ctx, p.TaskID, PrincipalFrom(ctx))
		if errors.Is(err, ErrNotFound) {
			return nil, notFound()
		}
		if err != nil {
			return nil, s.failed("task lookup failed", p.TaskID, err)
		}
		switch t.Status {
		case Completed:
			return &PayloadResult{raw: t.Result, taskID: t.ID}, nil
		case Failed:
			msg := "the task failed"
			if t.Error != nil {
				msg = t.Error.Message
			}
			return nil, &jsonrpc.Error{Code: CodeInternalError, Message: msg}
		case Cancelled:
			return nil, &jsonrpc.Error{Code: CodeInvalidRequest, Message: "the task was cancelled"}
		case InputRequired:
			return nil, &jsonrpc.Error{Code: CodeInvalidRequest, Message: "the task needs input that only a client of " + ExtensionID +
				" (protocol " + ProtocolVersion + ") can give; cancel it, or call the tool again from such a client"}
		}
		if time.Now().Add(wait).After(deadline) {
			return nil, &jsonrpc.Error{Code: CodeInvalidRequest, Message: fmt.Sprintf("task %s is still %s; ask tasks/get, and tasks/result once it is over", t.ID, t.Status)}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// listPage bounds one page of tasks/list.
const listPage = 50

// list is tasks/list: the caller's tasks, newest first, a page at a time
// (the cursor is the last task's creation time and id).
func (s *Server) list(ctx context.Context, _ *sdk.ServerSession, p *ListParams) (*LegacyListResult, error) {
	if err := legacyOnly(ctx, MethodList); err != nil {
		return nil, err
	}
	page, next, err := s.Store.ListFor(ctx, PrincipalFrom(ctx), p.Cursor, listPage)
	if errors.Is(err, errBadCursor) {
		return nil, &jsonrpc.Error{Code: CodeInvalidParams, Message: "invalid cursor"}
	}
	if err != nil {
		return nil, s.failed("task list failed", "", err)
	}
	out := &LegacyListResult{Tasks: make([]LegacyTask, 0, len(page)), NextCursor: next}
	for _, t := range page {
		out.Tasks = append(out.Tasks, t.Legacy())
	}
	return out, nil
}

var errBadCursor = errors.New("tasks: invalid cursor")

// ListFor returns principal's tasks, newest first, at most limit after
// cursor ("" for the first page), and the cursor of the next page ("" when
// there is none).
func (s *Store) ListFor(ctx context.Context, principal, cursor string, limit int) ([]*Task, string, error) {
	before, beforeID := time.Now().Add(100*365*24*time.Hour), ""
	if cursor != "" {
		at, id, ok := cutCursor(cursor)
		if !ok {
			return nil, "", errBadCursor
		}
		before, beforeID = at, id
	}
	rows, err := s.DB.Query(ctx, `SELECT `+columns+` FROM pep.tasks WHERE principal = $1 AND (created_at, id) < ($2, $3)
		ORDER BY created_at DESC, id DESC LIMIT $4`, principal, before, beforeID, limit+1)
	if err != nil {
		return nil, "", err
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Task, error) { return scan(r) })
	if err != nil || len(list) <= limit {
		return list, "", err
	}
	list = list[:limit]
	last := list[limit-1]
	return list, last.CreatedAt.UTC().Format(time.RFC3339Nano) + " " + last.ID, nil
}

func cutCursor(c string) (time.Time, string, bool) {
	for i := len(c) - 1; i >= 0; i-- {
		if c[i] == ' ' {
			at, err := time.Parse(time.RFC3339Nano, c[:i])
			return at, c[i+1:], err == nil && c[i+1:] != ""
		}
	}
	return time.Time{}, "", false
}
