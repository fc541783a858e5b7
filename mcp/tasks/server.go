package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"sort"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/omcp/arap/internal/dbdown"
)

// Kind is what a kind of task does on cancel and on input.
type Kind interface {
	// Cancel tries to cancel t for its principal. Cancellation is
	// cooperative: the kind decides whether it can still happen.
	Cancel(ctx context.Context, t *Task) error
	// Update receives answers to outstanding input requests (only keys that
	// are outstanding and unanswered). An error whose message the client
	// should see is an *InputError.
	Update(ctx context.Context, t *Task, responses map[string]json.RawMessage) error
}

// InputError rejects an answer; the key stays outstanding.
type InputError struct{ Msg string }

func (e *InputError) Error() string { return e.Msg }

// Server serves the extension's methods.
type Server struct {
	Store *Store
	Kinds map[string]Kind
	// Notifier serves subscriptions/listen for tasks; without one, listen
	// streams for tasks are refused.
	Notifier *Notifier
	// Changes, when set, serves listen streams' other opt-ins (list
	// changes, resource subscriptions); they still need the Notifier,
	// which bounds every caller's streams.
	Changes Changes
	Log     *slog.Logger
}

type principalKey struct{}

// WithPrincipal records the authenticated caller in ctx.
func WithPrincipal(ctx context.Context, p string) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalFrom returns the authenticated caller, or "".
func PrincipalFrom(ctx context.Context) string {
	p, _ := ctx.Value(principalKey{}).(string)
	return p
}

// HasExtension reports whether a request's _meta declares the tasks
// extension in its client capabilities (the only place it counts: servers
// must not remember capabilities across requests).
func HasExtension(meta map[string]any) bool {
	caps, _ := meta[MetaClientCapabilities].(map[string]any)
	ext, _ := caps["extensions"].(map[string]any)
	_, ok := ext[ExtensionID]
	return ok
}

// MissingCapability is the -32021 error naming the tasks extension.
func MissingCapability() *jsonrpc.Error {
	return MissingCapabilities(map[string]any{"extensions": map[string]any{ExtensionID: map[string]any{}}})
}

// MissingCapabilities is the -32021 error naming the client capabilities a
// request needs (a ClientCapabilities object).
func MissingCapabilities(caps map[string]any) *jsonrpc.Error {
	data, _ := json.Marshal(map[string]any{"requiredCapabilities": caps})
	return &jsonrpc.Error{Code: CodeMissingRequiredCapabilities, Message: "Missing required client capability", Data: data}
}

func notFound() *jsonrpc.Error {
	return &jsonrpc.Error{Code: CodeInvalidParams, Message: "task not found"}
}

// TaskParams are the params of tasks/get and tasks/cancel.
type TaskParams struct {
	sdk.ParamsBase
	TaskID string `json:"taskId"`
}

// UpdateParams are the params of tasks/update.
type UpdateParams struct {
	sdk.ParamsBase
	TaskID         string                     `json:"taskId"`
	InputResponses map[string]json.RawMessage `json:"inputResponses"`
}

// GetResult is the result of tasks/get: a DetailedTask.
type GetResult struct {
	sdk.ResultBase
	ResultType string `json:"resultType"`
	Detailed
}

// AckResult is the empty acknowledgement of tasks/update and tasks/cancel.
type AckResult struct {
	sdk.ResultBase
	ResultType string `json:"resultType"`
}

// CreateResult is a CreateTaskResult: the flat Task with resultType "task".
type CreateResult struct {
	sdk.ResultBase
	ResultType string `json:"resultType"`
	Wire
}

// NewCreateResult renders t as a CreateTaskResult with extra _meta.
func NewCreateResult(t *Task, meta map[string]any) *CreateResult {
	r := &CreateResult{ResultType: ResultTypeTask, Wire: t.Wire()}
	r.Meta = merge(t.Meta, meta)
	return r
}

func merge(a, b map[string]any) map[string]any {
	if len(a)+len(b) == 0 {
		return nil
	}
	out := make(map[string]any, len(a)+len(b))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// Register adds tasks/get, tasks/update and tasks/cancel to an SDK server,
// and for clients of 2025-11-25 tasks/result and tasks/list (legacy.go).
func (s *Server) Register(srv *sdk.Server) error {
	if err := sdk.AddReceivingCustomMethod(srv, MethodGet, s.get); err != nil {
		return err
	}
	if err := sdk.AddReceivingCustomMethod(srv, MethodUpdate, s.update); err != nil {
		return err
	}
	if err := sdk.AddReceivingCustomMethod(srv, MethodResult, s.result); err != nil {
		return err
	}
	if err := sdk.AddReceivingCustomMethod(srv, MethodList, s.list); err != nil {
		return err
	}
	return sdk.AddReceivingCustomMethod(srv, MethodCancel, s.cancel)
}

// lookup applies the checks every task method shares: the extension must be
// declared on this request, and the task must belong to the caller.
func (s *Server) lookup(ctx context.Context, meta map[string]any, id string) (*Task, error) {
	if !HasExtension(meta) && !IsLegacy(ctx) {
		return nil, MissingCapability()
	}
	t, err := s.Store.GetFor(ctx, id, PrincipalFrom(ctx))
	if errors.Is(err, ErrNotFound) {
		return nil, notFound()
	}
	if err != nil {
		return nil, s.failed("task lookup failed", id, err)
	}
	return t, nil
}

func (s *Server) get(ctx context.Context, _ *sdk.ServerSession, p *TaskParams) (sdk.Result, error) {
	t, err := s.lookup(ctx, p.GetMeta(), p.TaskID)
	if err != nil {
		return nil, err
	}
	if IsLegacy(ctx) {
		return &LegacyTaskResult{LegacyTask: t.Legacy()}, nil
	}
	r := &GetResult{ResultType: ResultTypeComplete, Detailed: t.Detailed()}
	r.Meta = merge(t.Meta, nil)
	return r, nil
}

func (s *Server) update(ctx context.Context, _ *sdk.ServerSession, p *UpdateParams) (*AckResult, error) {
	if IsLegacy(ctx) {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "method not found: " + MethodUpdate + " (" + ExtensionID + ", protocol " + ProtocolVersion + ")"}
	}
	t, err := s.lookup(ctx, p.GetMeta(), p.TaskID)
	if err != nil {
		return nil, err
	}
	ack := &AckResult{ResultType: ResultTypeComplete}
	if t.Status != InputRequired {
		return ack, nil // nothing outstanding: answers are ignored
	}
	// Only keys outstanding and not yet answered count; others are ignored.
	fresh := map[string]json.RawMessage{}
	for k, v := range p.InputResponses {
		if _, out := t.InputRequests[k]; out && !slices.Contains(t.AnsweredKeys, k) {
			fresh[k] = v
		}
	}
	if len(fresh) == 0 {
		return ack, nil
	}
	kind, ok := s.Kinds[t.Kind]
	if !ok {
		return nil, &jsonrpc.Error{Code: CodeInternalError, Message: "task kind not served here"}
	}
	if err := kind.Update(ctx, t, fresh); err != nil {
		var ie *InputError
		if errors.As(err, &ie) {
			return nil, &jsonrpc.Error{Code: CodeInvalidParams, Message: ie.Msg}
		}
		return nil, s.failed("task update failed", t.ID, err)
	}
	return ack, nil
}

func (s *Server) cancel(ctx context.Context, _ *sdk.ServerSession, p *TaskParams) (sdk.Result, error) {
	t, err := s.lookup(ctx, p.GetMeta(), p.TaskID)
	if err != nil {
		return nil, err
	}
	if !t.Status.Terminal() {
		kind, ok := s.Kinds[t.Kind]
		if !ok {
			return nil, &jsonrpc.Error{Code: CodeInternalError, Message: "task kind not served here"}
		}
		if err := kind.Cancel(ctx, t); err != nil {
			return nil, s.failed("task cancel failed", t.ID, err)
		}
	}
	if IsLegacy(ctx) { // the task as the cancel left it
		if t, err = s.Store.Get(ctx, s.Store.DB, t.ID); err != nil {
			return nil, s.failed("task lookup failed", p.TaskID, err)
		}
		return &LegacyTaskResult{LegacyTask: t.Legacy()}, nil
	}
	return &AckResult{ResultType: ResultTypeComplete}, nil
}

// failed is the error of a task method that failed, not by the caller's
// fault (InternalError).
func (s *Server) failed(what, taskID string, err error) *jsonrpc.Error {
	return InternalError(s.log(), what, err, "task_id", taskID)
}

// InternalError is the answer to a request that failed, not by the caller's
// fault: retryable (Unavailable) while the database is unavailable,
// otherwise an internal error that says nothing of its cause (an error's
// own text names tables and addresses), which is logged with args. A
// Kind's own Unavailable error (the backend unavailable) passes as it is.
func InternalError(log *slog.Logger, what string, err error, args ...any) *jsonrpc.Error {
	var je *jsonrpc.Error
	if errors.As(err, &je) && je.Code == CodeUnavailable {
		return je
	}
	args = append(args, "error", err)
	switch {
	case dbdown.Is(err):
		log.Warn(what+": database unavailable", args...)
		return Unavailable(WhatDatabase)
	case errors.Is(err, context.Canceled): // the caller went away
		log.Debug(what+": cancelled", args...)
	default:
		log.Error(what, args...)
	}
	return &jsonrpc.Error{Code: CodeInternalError, Message: "internal error"}
}

// Outstanding lists t's input request keys not yet answered, sorted.
func (t *Task) Outstanding() []string {
	var keys []string
	for k := range t.InputRequests {
		if !slices.Contains(t.AnsweredKeys, k) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}
