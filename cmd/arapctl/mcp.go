package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/omcp/arap/internal/config"
	"github.com/omcp/arap/mcp/oauthclient"
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

// mcpCmd holds what every mcp command shares.
type mcpCmd struct {
	client *tasks.Client
	state  *taskFile
	inputs map[string]string
	out    io.Writer
}

// mcpFlags are the flags every mcp command has; state adds --state (the
// commands that start, finish or forget tasks) and input adds --input (the
// ones that can answer input requests).
type mcpFlags struct {
	endpoint, state *string
	token           *config.Secret
	inputs          *multi
	// Without a token: the MCP authorization specification's OAuth flow.
	clientID, metadataURL, redirect, store *string
	clientSecret                           *config.Secret
}

// newMCPFlags defines the MCP client's settings; in the config file they
// are mcp-url, mcp-token-file and mcp-state (url is the decision API's).
func newMCPFlags(fs *flag.FlagSet, state, input bool) *mcpFlags {
	c := settings(fs)
	f := &mcpFlags{
		endpoint:    c.String("url", "http://127.0.0.1:8481/mcp", "MCP endpoint", "ARAP_MCP_URL"),
		token:       c.Secret("token", "the MCP caller's bearer token; without one, arapctl signs in by OAuth as the server's protected resource metadata says", "ARAP_MCP_TOKEN"),
		clientID:    c.String("client-id", "", "OAuth: a client registered at the authorization server beforehand (without one: a client ID metadata document where taken, else dynamic registration)", "ARAP_MCP_CLIENT_ID"),
		metadataURL: c.String("client-metadata-url", "", "OAuth: the URL of this client's ID metadata document, for authorization servers that take them", "ARAP_MCP_CLIENT_METADATA_URL"),
		redirect:    c.String("redirect-url", oauthclient.DefaultRedirect, "OAuth: where the browser is sent back (on loopback, arapctl listens there)", "ARAP_MCP_REDIRECT_URL"),
		store:       c.String("oauth-store", defaultOAuthStore(), "OAuth: the file keeping tokens and registrations between runs (mode 0600)", "ARAP_MCP_OAUTH_STORE"),
	}
	f.clientSecret = c.Secret("client-secret", "OAuth: the pre-registered client's secret", "ARAP_MCP_CLIENT_SECRET")
	c.Key("url", "mcp-url")
	c.Key("token-file", "mcp-token-file")
	if state {
		f.state = c.String("state", defaultStateFile(), "file remembering unfinished tasks", "ARAP_MCP_STATE")
		c.Key("state", "mcp-state")
	}
	if input {
		f.inputs = &multi{}
		fs.Var(f.inputs, "input", "an answer to an input request, field=value (repeatable)")
	}
	return f
}

// cmd checks the flags and builds the command's client.
func (f *mcpFlags) cmd(out io.Writer) (*mcpCmd, error) {
	m := &mcpCmd{client: &tasks.Client{URL: *f.endpoint, Token: f.token.Value()}, out: out}
	if !f.token.IsSet() {
		h, err := oauthclient.New(oauthclient.Config{Server: *f.endpoint, Store: *f.store, ClientID: *f.clientID, ClientSecret: f.clientSecret.Value(),
			ClientMetadataURL: *f.metadataURL, RedirectURL: *f.redirect, Prompt: os.Stderr})
		if err != nil {
			return nil, err
		}
		m.client.Auth = h
	}
	if f.state != nil {
		m.state = &taskFile{path: *f.state}
	}
	if f.inputs != nil {
		var err error
		if m.inputs, err = pairs(*f.inputs, "--input"); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// interruptible is a context that ends on Ctrl-C or SIGTERM.
func interruptible() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

func mcpCall(fs *flag.FlagSet) action {
	f := newMCPFlags(fs, true, true)
	var argFlags multi
	fs.Var(&argFlags, "arg", "tool argument NAME=VALUE, typed by the tool's input schema: text for a string, JSON for a number, boolean, object or array; without a schema, JSON when it parses, else text (repeatable)")
	argsJSON := fs.String("args", "", "all tool arguments as one JSON object")
	noWait := fs.Bool("no-wait", false, "print the task and return without waiting")
	return func(s streams, pos []string) error {
		m, err := f.cmd(s.out)
		if err != nil {
			return err
		}
		ctx, stop := interruptible()
		defer stop()
		toolArgs, err := m.toolArguments(ctx, pos[0], argFlags, *argsJSON)
		if err != nil {
			return err
		}
		return m.call(ctx, pos[0], toolArgs, !*noWait)
	}
}

func mcpGet(fs *flag.FlagSet) action {
	f := newMCPFlags(fs, false, false)
	asJSON := fs.Bool("json", false, "print the task as JSON")
	return func(s streams, pos []string) error {
		m, err := f.cmd(s.out)
		if err != nil {
			return err
		}
		ctx, stop := interruptible()
		defer stop()
		d, raw, err := m.client.Get(ctx, pos[0])
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(s.out, raw)
		}
		m.printTask(d)
		return nil
	}
}

func mcpCancel(fs *flag.FlagSet) action {
	f := newMCPFlags(fs, true, false)
	return func(s streams, pos []string) error {
		m, err := f.cmd(s.out)
		if err != nil {
			return err
		}
		ctx, stop := interruptible()
		defer stop()
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
	}
}

func mcpWait(fs *flag.FlagSet) action {
	f := newMCPFlags(fs, true, true)
	return func(s streams, ids []string) error {
		m, err := f.cmd(s.out)
		if err != nil {
			return err
		}
		ctx, stop := interruptible()
		defer stop()
		if len(ids) == 0 {
			if ids, err = m.state.pending(*f.endpoint); err != nil {
				return err
			}
			if len(ids) == 0 {
				fmt.Fprintf(s.out, "no unfinished tasks in %s\n", m.state.path)
				return nil
			}
		}
		var failed error
		for _, id := range ids {
			d, _, err := m.client.Get(ctx, id)
			if err == nil {
				if !d.Status.Terminal() {
					m.printTask(d) // where it is now; wait prints how it ends
				}
				err = m.wait(ctx, id)
			}
			if err != nil {
				if len(ids) == 1 {
					return err
				}
				fmt.Fprintf(s.out, "task %s: %v\n", id, err)
				failed = err
			}
		}
		return failed
	}
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
		r, err = m.client.Retry(ctx, tool, args, r, responses)
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
			// printTask said how it ended; the exit message adds why.
			msg := fmt.Sprintf("the task did not complete (%s)", d.Status)
			if d.Error != nil {
				msg = fmt.Sprintf("%s (%d)", d.Error.Message, d.Error.Code)
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

func pairs(flags []string, name string) (map[string]string, error) {
	out := map[string]string{}
	for _, f := range flags {
		k, v, ok := strings.Cut(f, "=")
		if !ok || k == "" {
			return nil, usageError{msg: fmt.Sprintf("%s %q: want name=value", name, f)}
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
