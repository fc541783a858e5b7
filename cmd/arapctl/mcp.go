package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/omcp/arap/mcp/tasks"
)

// The mcp commands are an MCP client built on the tasks extension alone: they
// know tasks, MRTR input requests and CallToolResults, and nothing about
// approvals. An approval-gated call is, to them, a task that takes a while.

// Exit statuses of the mcp commands besides 0 (the tool ran) and 2 (usage).
const (
	exitFailed = 1 // an error result, a failed or cancelled task, or an error
	exitInput  = 3 // the server asks for input that --input did not give
	exitPaused = 4 // interrupted while the task is still running
)

type exitError struct {
	code int
	msg  string
}

func (e exitError) Error() string { return e.msg }

// mcpCmd holds what every mcp command shares.
type mcpCmd struct {
	client *tasks.Client
	state  *taskFile
	inputs map[string]string
	out    io.Writer
}

func mcpCommand(sub string, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("mcp "+sub, flag.ContinueOnError)
	endpoint := fs.String("url", envOr("ARAP_MCP_URL", "http://127.0.0.1:8481/mcp"), "MCP endpoint (ARAP_MCP_URL)")
	token := fs.String("token", os.Getenv("ARAP_MCP_TOKEN"), "bearer token of the MCP caller (ARAP_MCP_TOKEN)")
	stateFile := fs.String("state", defaultStateFile(), "file remembering unfinished tasks (ARAP_MCP_STATE)")
	var argFlags, inputFlags multi
	fs.Var(&argFlags, "arg", "call: tool argument name=value; the value is JSON when it parses as JSON, else a string (repeatable)")
	argsJSON := fs.String("args", "", "call: all tool arguments as one JSON object")
	fs.Var(&inputFlags, "input", "an answer to an input request, field=value (repeatable)")
	noWait := fs.Bool("no-wait", false, "call: print the task and return without waiting")
	asJSON := fs.Bool("json", false, "get: print the task as JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if *token == "" {
		return usageError{"a token is required: --token or ARAP_MCP_TOKEN"}
	}
	inputs, err := pairs(inputFlags, "--input")
	if err != nil {
		return err
	}
	m := &mcpCmd{client: &tasks.Client{URL: *endpoint, Token: *token}, state: &taskFile{path: *stateFile}, inputs: inputs, out: out}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch sub {
	case "call":
		if len(pos) != 1 {
			return usageError{"mcp call takes one tool name"}
		}
		toolArgs, err := toolArguments(argFlags, *argsJSON)
		if err != nil {
			return err
		}
		return m.call(ctx, pos[0], toolArgs, !*noWait)
	case "get":
		if len(pos) != 1 {
			return usageError{"mcp get takes one task id"}
		}
		d, raw, err := m.client.Get(ctx, pos[0])
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(out, raw)
		}
		m.printTask(d)
		return nil
	case "cancel":
		if len(pos) != 1 {
			return usageError{"mcp cancel takes one task id"}
		}
		if err := m.client.Cancel(ctx, pos[0]); err != nil {
			return err
		}
		d, _, err := m.client.Get(ctx, pos[0])
		if err != nil {
			return err
		}
		m.printTask(d)
		if d.Status.Terminal() {
			_ = m.state.forget(d.TaskID)
		}
		return nil
	case "wait":
		ids := pos
		if len(ids) == 0 {
			if ids, err = m.state.pending(*endpoint); err != nil {
				return err
			}
			if len(ids) == 0 {
				fmt.Fprintf(out, "no unfinished tasks in %s\n", m.state.path)
				return nil
			}
		}
		var failed error
		for _, id := range ids {
			d, _, err := m.client.Get(ctx, id)
			if err == nil {
				m.printTask(d)
				err = m.wait(ctx, id)
			}
			if err != nil {
				if len(ids) == 1 {
					return err
				}
				fmt.Fprintf(out, "task %s: %v\n", id, err)
				failed = err
			}
		}
		return failed
	}
	return usageError{fmt.Sprintf("unknown command %q", "mcp "+sub)}
}

// call calls the tool, answering input requests from --input; a task is
// remembered and, unless told otherwise, waited for.
func (m *mcpCmd) call(ctx context.Context, tool string, args map[string]any, wait bool) error {
	r, err := m.client.CallTool(ctx, tool, args, nil)
	for answered := false; err == nil && r.ResultType == tasks.ResultTypeInputRequired; answered = true {
		responses, missing := m.answers(r.InputRequests)
		if answered || len(missing) > 0 {
			m.printInputRequests(r.InputRequests)
			return exitError{exitInput, fmt.Sprintf("input required: run the call again with %s", inputHint(missing, r.InputRequests))}
		}
		r, err = m.client.CallTool(ctx, tool, args, map[string]any{"inputResponses": responses, "requestState": r.RequestState})
	}
	if err != nil {
		return err
	}
	if r.Task == nil {
		return m.result(r.Raw)
	}
	if err := m.state.remember(r.Task.TaskID, m.client.URL, tool); err != nil {
		return err
	}
	m.printTask(r.Task)
	if !wait {
		fmt.Fprintf(m.out, "resume with: arapctl mcp wait %s\n", r.Task.TaskID)
		return nil
	}
	return m.wait(ctx, r.Task.TaskID)
}

// wait polls a task (honouring its pollIntervalMs) until it ends, answering
// input requests from --input, and prints the final result.
func (m *mcpCmd) wait(ctx context.Context, id string) error {
	// Each input request gets a new key, so answering cannot loop on one;
	// the bound stops a server that keeps asking.
	for updates := 0; ; {
		d, err := m.client.Wait(ctx, id)
		if err != nil {
			if ctx.Err() != nil {
				return exitError{exitPaused, fmt.Sprintf("stopped waiting; task %s is still running (resume with: arapctl mcp wait %s)", id, id)}
			}
			return err
		}
		switch d.Status {
		case tasks.InputRequired:
			responses, missing := m.answers(d.InputRequests)
			if len(missing) > 0 || updates == 3 {
				m.printTask(d)
				return exitError{exitInput, fmt.Sprintf("input required: answer with arapctl mcp wait %s %s", id, inputHint(missing, d.InputRequests))}
			}
			fmt.Fprintf(m.out, "task %s: answering %d input request(s)\n", id, len(responses))
			if err := m.client.Update(ctx, id, responses); err != nil {
				return err
			}
			updates++
			continue
		case tasks.Completed:
			_ = m.state.forget(id)
			m.printTask(d)
			return m.result(d.Result)
		default:
			_ = m.state.forget(id)
			m.printTask(d)
			msg := fmt.Sprintf("task %s %s", id, d.Status)
			if d.Error != nil {
				msg += fmt.Sprintf(": %s (%d)", d.Error.Message, d.Error.Code)
			}
			return exitError{exitFailed, msg}
		}
	}
}

// result prints a CallToolResult; an error result is a failure.
func (m *mcpCmd) result(raw json.RawMessage) error {
	if err := printJSON(m.out, raw); err != nil {
		return err
	}
	var r struct {
		IsError bool `json:"isError"`
	}
	_ = json.Unmarshal(raw, &r)
	if r.IsError {
		return exitError{exitFailed, "the tool call ended in an error result"}
	}
	return nil
}

func (m *mcpCmd) printTask(d *tasks.Detailed) {
	line := fmt.Sprintf("task %s %s", d.TaskID, d.Status)
	if d.StatusMessage != "" {
		line += ": " + d.StatusMessage
	}
	if !d.Status.Terminal() && d.PollIntervalMs > 0 {
		line += fmt.Sprintf(" (polling every %s)", time.Duration(d.PollIntervalMs)*time.Millisecond)
	}
	fmt.Fprintln(m.out, line)
	if d.Status == tasks.InputRequired {
		m.printInputRequests(d.InputRequests)
	}
}

// printInputRequests shows each form's message and fields.
func (m *mcpCmd) printInputRequests(reqs map[string]any) {
	for _, key := range sortedKeys(reqs) {
		req := elicitation(reqs[key])
		msg, _ := req["message"].(string)
		fmt.Fprintf(m.out, "input requested: %s\n", msg)
		for _, f := range formFields(req) {
			fmt.Fprintf(m.out, "  --input %s=...  %s\n", f.name, f.describe)
		}
	}
}

type formField struct{ name, describe string }

// elicitation returns an input request's elicitation parameters (an input
// request is {method, params}).
func elicitation(req any) map[string]any {
	m, _ := req.(map[string]any)
	if p, ok := m["params"].(map[string]any); ok {
		return p
	}
	return m
}

// formFields lists the properties of a form-mode elicitation's schema.
func formFields(req map[string]any) []formField {
	schema, _ := req["requestedSchema"].(map[string]any)
	props, _ := schema["properties"].(map[string]any)
	required := map[string]bool{}
	if rs, ok := schema["required"].([]any); ok {
		for _, r := range rs {
			if s, ok := r.(string); ok {
				required[s] = true
			}
		}
	}
	var out []formField
	for _, name := range sortedKeys(props) {
		p, _ := props[name].(map[string]any)
		var parts []string
		if t, ok := p["type"].(string); ok {
			parts = append(parts, t)
		}
		if required[name] {
			parts = append(parts, "required")
		}
		d := strings.Join(parts, ", ")
		if desc, ok := p["description"].(string); ok {
			d = "(" + d + ") " + desc
		} else if d != "" {
			d = "(" + d + ")"
		}
		out = append(out, formField{name, d})
	}
	return out
}

// answers builds inputResponses from --input for every form requested, and
// lists the fields --input lacks.
func (m *mcpCmd) answers(reqs map[string]any) (map[string]any, []string) {
	responses := map[string]any{}
	var missing []string
	for _, key := range sortedKeys(reqs) {
		req := elicitation(reqs[key])
		content := map[string]any{}
		for _, f := range formFields(req) {
			v, ok := m.inputs[f.name]
			if !ok {
				if strings.Contains(f.describe, "required") {
					missing = append(missing, f.name)
				}
				continue
			}
			content[f.name] = v
		}
		responses[key] = map[string]any{"action": "accept", "content": content}
	}
	return responses, missing
}

func inputHint(missing []string, reqs map[string]any) string {
	if len(missing) == 0 {
		for _, key := range sortedKeys(reqs) {
			for _, f := range formFields(elicitation(reqs[key])) {
				missing = append(missing, f.name)
			}
		}
	}
	var parts []string
	for _, f := range missing {
		parts = append(parts, "--input "+f+"=...")
	}
	return strings.Join(parts, " ")
}

func toolArguments(flags []string, raw string) (map[string]any, error) {
	args := map[string]any{}
	if raw != "" {
		if err := json.Unmarshal([]byte(raw), &args); err != nil {
			return nil, usageError{"--args must be a JSON object: " + err.Error()}
		}
	}
	kv, err := pairs(flags, "--arg")
	if err != nil {
		return nil, err
	}
	for k, v := range kv {
		var parsed any
		if json.Unmarshal([]byte(v), &parsed) == nil {
			args[k] = parsed
		} else {
			args[k] = v
		}
	}
	return args, nil
}

func pairs(flags []string, name string) (map[string]string, error) {
	out := map[string]string{}
	for _, f := range flags {
		k, v, ok := strings.Cut(f, "=")
		if !ok || k == "" {
			return nil, usageError{fmt.Sprintf("%s %q: want name=value", name, f)}
		}
		out[k] = v
	}
	return out, nil
}

func printJSON(out io.Writer, raw json.RawMessage) error {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return fmt.Errorf("the server sent a result that is not JSON: %w", err)
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// taskFile remembers the tasks this client started and has not seen end, so
// that wait resumes them after the client restarts.
type taskFile struct{ path string }

type rememberedTask struct {
	Server  string    `json:"server"`
	Tool    string    `json:"tool"`
	Created time.Time `json:"created"`
}

func defaultStateFile() string {
	if p := os.Getenv("ARAP_MCP_STATE"); p != "" {
		return p
	}
	dir := os.Getenv("XDG_STATE_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ".arapctl-tasks.json"
		}
		dir = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(dir, "arapctl", "tasks.json")
}

func (f *taskFile) load() (map[string]rememberedTask, error) {
	m := map[string]rememberedTask{}
	b, err := os.ReadFile(f.path)
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("task file %s is damaged: %w", f.path, err)
	}
	return m, nil
}

// save writes atomically: a crash leaves the old file or the new one.
func (f *taskFile) save(m map[string]rememberedTask) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(f.path), ".tasks-*.json")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), f.path)
}

// update changes the file under an exclusive lock, so that clients running
// at once (a call waiting in one terminal, another call in the next) do not
// lose each other's task ids.
func (f *taskFile) update(change func(m map[string]rememberedTask)) error {
	if err := os.MkdirAll(filepath.Dir(f.path), 0o700); err != nil {
		return err
	}
	lock, err := os.OpenFile(f.path+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close() // closing releases the lock
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	m, err := f.load()
	if err != nil {
		return err
	}
	change(m)
	return f.save(m)
}

func (f *taskFile) remember(id, server, tool string) error {
	return f.update(func(m map[string]rememberedTask) {
		m[id] = rememberedTask{Server: server, Tool: tool, Created: time.Now().UTC()}
	})
}

func (f *taskFile) forget(id string) error {
	return f.update(func(m map[string]rememberedTask) { delete(m, id) })
}

// pending lists the remembered tasks of server, oldest first.
func (f *taskFile) pending(server string) ([]string, error) {
	m, err := f.load()
	if err != nil {
		return nil, err
	}
	var ids []string
	for id, t := range m {
		if t.Server == server {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return m[ids[i]].Created.Before(m[ids[j]].Created) })
	return ids, nil
}
