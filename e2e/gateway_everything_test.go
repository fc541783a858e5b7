package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	osexec "os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/npmtest"
	"github.com/omcp/arap/mcp/tasks"
)

// everythingPolicy is the backend policy in front of the everything
// server: what it marks read-only is allowed, as are its resources and
// prompts; toggle-simulated-logging (which changes the server's state)
// needs one approval; everything else is denied.
const everythingPolicy = `
version: 1
rules:
  - name: everything_read_only
    match: {action: tools/call, resource_type: mcp_tool}
    when: >-
      resource.properties.upstream == "everything" &&
      has(resource.properties.annotations) &&
      has(resource.properties.annotations.readOnlyHint) &&
      resource.properties.annotations.readOnlyHint == true
    effect: allow
  - name: everything_toggle
    match: {action: tools/call, resource_type: mcp_tool}
    when: >-
      resource.properties.upstream == "everything" &&
      resource.properties.upstream_tool == "toggle-simulated-logging"
    effect: request
    template: everything_change
    display:
      title: Server change
      description: Changing the everything server's state requires one approval.
    approval: {quorum: 1, groups: [platform], kinds: [itsm]}
  - name: everything_resources
    match: {action: resources/read, resource_type: mcp_resource}
    when: resource.properties.upstream == "everything"
    effect: allow
  - name: everything_prompts
    match: {action: prompts/get, resource_type: mcp_prompt}
    when: resource.properties.upstream == "everything"
    effect: allow
`

// everythingPrefix is the upstream's prefix: its tools and prompts are
// offered as ev_<name>.
const everythingPrefix = "ev_"

// startEverything runs the reference everything server over streamable
// HTTP and returns its MCP endpoint. It listens on PORT (0: the kernel
// picks a free port as it binds; the test reads it back).
func startEverything(t *testing.T) string {
	t.Helper()
	cmd := osexec.Command(npmtest.Everything(t), "streamableHttp")
	cmd.Env = append(os.Environ(), "PORT=0")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &logs // read only after Wait
	cmd.WaitDelay = 5 * time.Second
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("everything server's stderr:\n%s", logs.String())
		}
	})
	port := listeningPort(t, cmd.Process.Pid, exited, 60*time.Second)
	return fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
}

// directMCP is a raw MCP client of the everything server, for comparing what
// the gateway passes through with what the server itself says: it keeps
// every field as the server wrote it (no SDK types in between). It speaks
// the revision the gateway's upstream connection negotiates with this
// server (2025-11-25, the newest the server knows) and declares the same
// (empty) client capabilities, so the server offers both the same things.
type directMCP struct {
	url, session, version string
	id                    atomic.Int64
}

func newDirectMCP(t *testing.T, url string) *directMCP {
	t.Helper()
	d := &directMCP{url: url}
	res, _, hdr := d.post(t, "initialize", map[string]any{
		"protocolVersion": "2025-11-25", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "e2e-direct", "version": "0"},
	})
	var init struct {
		ProtocolVersion string `json:"protocolVersion"`
	}
	require.NoError(t, json.Unmarshal(res, &init))
	d.version, d.session = init.ProtocolVersion, hdr.Get("Mcp-Session-Id")
	require.NotEmpty(t, d.session)
	d.notify(t, "notifications/initialized")
	return d
}

// call sends a request and returns its result.
func (d *directMCP) call(t *testing.T, method string, params map[string]any) json.RawMessage {
	t.Helper()
	res, _, _ := d.post(t, method, params)
	return res
}

func (d *directMCP) notify(t *testing.T, method string) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": method})
	require.NoError(t, err)
	resp := d.send(t, body)
	resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
}

func (d *directMCP) send(t *testing.T, body []byte) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, d.url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if d.session != "" {
		req.Header.Set("Mcp-Session-Id", d.session)
		req.Header.Set("Mcp-Protocol-Version", d.version)
	}
	resp, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
	require.NoError(t, err)
	return resp
}

// post sends a request and returns its result, the notifications that came
// before it on the same stream, and the response's headers.
func (d *directMCP) post(t *testing.T, method string, params map[string]any) (json.RawMessage, []json.RawMessage, http.Header) {
	t.Helper()
	id := d.id.Add(1)
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	require.NoError(t, err)
	resp := d.send(t, body)
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", method, raw)
	msgs := [][]byte{raw}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		msgs = sseData(raw)
	}
	var notes []json.RawMessage
	for _, m := range msgs {
		var env struct {
			ID     *int64          `json:"id"`
			Result json.RawMessage `json:"result"`
			Error  json.RawMessage `json:"error"`
		}
		require.NoError(t, json.Unmarshal(m, &env), "%s", m)
		switch {
		case env.ID == nil:
			notes = append(notes, m)
		case *env.ID == id:
			require.Nil(t, env.Error, "%s: %s", method, m)
			return env.Result, notes, resp.Header
		}
	}
	t.Fatalf("%s: no response in %s", method, raw)
	return nil, nil, nil
}

// sseData is the data of each event of an SSE body.
func sseData(b []byte) [][]byte {
	var out [][]byte
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 8<<20)
	for sc.Scan() {
		// An event without data (the server's priming event) is not a message.
		if d, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: ")); ok && len(bytes.TrimSpace(d)) > 0 {
			out = append(out, bytes.Clone(d))
		}
	}
	return out
}

// gatewayCall sends a request to arapd mcp and returns its result.
func gatewayCall(t *testing.T, c *tasks.Client, method, name string, params map[string]any) json.RawMessage {
	t.Helper()
	r, err := c.Call(context.Background(), method, name, params)
	require.NoError(t, err)
	require.Nil(t, r.Error, "%s %s: %s", method, name, r.Raw)
	return r.Result
}

// decoded is a JSON value as a map, less the keys the gateway adds to
// results of its own revision, 2026-07-28 (resultType; ttlMs and
// cacheScope of list results; its serverInfo in _meta): what remains is
// what the upstream said.
func decoded(t *testing.T, raw json.RawMessage) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(raw, &m), "%s", raw)
	for _, k := range []string{"resultType", "ttlMs", "cacheScope"} {
		delete(m, k)
	}
	if meta, ok := m["_meta"].(map[string]any); ok {
		delete(meta, "io.modelcontextprotocol/serverInfo")
		if len(meta) == 0 {
			delete(m, "_meta")
		}
	}
	return m
}

// byName indexes a list result's entries (tools, prompts) by name, less
// prefix; entries without it (the gateway's own) are left out.
func byName(t *testing.T, raw json.RawMessage, key, prefix string) map[string]map[string]any {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(raw, &m), "%s", raw)
	var entries []map[string]any
	require.NoError(t, json.Unmarshal(m[key], &entries), "%s", raw)
	out := map[string]map[string]any{}
	for _, e := range entries {
		name, _ := e["name"].(string)
		if n, ok := strings.CutPrefix(name, prefix); ok {
			e["name"] = n
			out[n] = e
		}
	}
	return out
}

// timestamps are the times the everything server writes into what it
// generates (dynamic resources): equal up to them.
var timestamps = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z|\b\d{1,2}:\d\d:\d\d( [AP]M)?`)

// untimed replaces the timestamps in v, base64 blobs decoded first.
func untimed(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			if s, ok := e.(string); ok && k == "blob" {
				if b, err := base64.StdEncoding.DecodeString(s); err == nil {
					e = "blob:" + string(b)
				}
			}
			out[k] = untimed(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = untimed(e)
		}
		return out
	case string:
		return timestamps.ReplaceAllString(x, "<time>")
	}
	return v
}

// TestGatewayEverything puts arapd mcp in front of the reference
// everything server (npm, a real process over streamable HTTP) and checks
// that what the server offers passes through intact, compared in the same
// test with what the server says directly: tools/list (schemas, output
// schemas, annotations), an image's bytes and MIME type, resource links,
// embedded resources, structured content, resources/list and resources/read
// (text and blob), prompts/get; and that a tool needing an approval is
// gated: a denied call does not reach the server, an approved one does once.
func TestGatewayEverything(t *testing.T) {
	t.Parallel()
	direct := startEverything(t)
	ups := filepath.Join(t.TempDir(), "upstreams.yaml")
	require.NoError(t, os.WriteFile(ups, fmt.Appendf(nil, `
upstreams:
  - name: everything
    http: {url: %q}
    prefix: %s
    timeouts: {connect: 30s}
`, direct, everythingPrefix), 0o600))
	s := newStack(t, stackOptions{policy: everythingPolicy, mcpArgs: []string{"--upstreams", ups}})
	gw := s.client(s.alice)
	d := newDirectMCP(t, direct)

	// The front-end connects its upstreams after it starts serving.
	var gwTools json.RawMessage
	require.Eventually(t, func() bool {
		r, err := gw.Call(context.Background(), "tools/list", "", nil)
		if err != nil || r.Error != nil {
			return false
		}
		gwTools = r.Result
		return strings.Contains(string(r.Result), `"`+everythingPrefix+`get-tiny-image"`)
	}, 90*time.Second, 100*time.Millisecond, "the everything server's tools are offered")

	t.Run("tools/list: every tool with its schemas and annotations as the server lists it", func(t *testing.T) {
		want := byName(t, d.call(t, "tools/list", map[string]any{}), "tools", "")
		got := byName(t, gwTools, "tools", everythingPrefix)
		require.NotEmpty(t, want)
		// execution.taskSupport is the task opt-in of revision 2025-11-25,
		// which the tasks extension of 2026-07-28 replaced (the server
		// decides per call); behind the gateway it would be wrong anyway:
		// the gateway, not the upstream, makes a gated call a task.
		for name, tool := range want {
			require.Contains(t, tool, "execution", name)
			delete(tool, "execution")
		}
		require.Equal(t, want, got)
		// The variety this test relies on is there.
		require.Contains(t, want["get-structured-content"], "outputSchema")
		require.Contains(t, want["get-tiny-image"], "annotations")
	})

	callBoth := func(t *testing.T, tool string, args map[string]any) (map[string]any, map[string]any) {
		t.Helper()
		dr := d.call(t, "tools/call", map[string]any{"name": tool, "arguments": args})
		gr := gatewayCall(t, gw, "tools/call", everythingPrefix+tool, map[string]any{"name": everythingPrefix + tool, "arguments": args})
		return decoded(t, dr), decoded(t, gr)
	}

	t.Run("an image: bytes and MIME type intact", func(t *testing.T) {
		want, got := callBoth(t, "get-tiny-image", map[string]any{})
		require.Equal(t, want, got)
		content := got["content"].([]any)
		var images int
		for _, c := range content {
			c := c.(map[string]any)
			if c["type"] != "image" {
				continue
			}
			images++
			require.Equal(t, "image/png", c["mimeType"])
			b, err := base64.StdEncoding.DecodeString(c["data"].(string))
			require.NoError(t, err)
			require.True(t, bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")), "PNG bytes")
		}
		require.Equal(t, 1, images, "%v", content)
	})

	t.Run("annotated content: text and image annotations intact", func(t *testing.T) {
		want, got := callBoth(t, "get-annotated-message", map[string]any{"messageType": "success", "includeImage": true})
		require.Equal(t, want, got)
		require.Contains(t, fmt.Sprint(got["content"]), "audience")
	})

	t.Run("resource links and embedded resources intact", func(t *testing.T) {
		want, got := callBoth(t, "get-resource-links", map[string]any{"count": 4})
		require.Equal(t, untimed(want), untimed(got))
		require.Contains(t, fmt.Sprint(got["content"]), "resource_link")

		want, got = callBoth(t, "get-resource-reference", map[string]any{"resourceType": "Blob", "resourceId": 2})
		require.Equal(t, untimed(want), untimed(got))
		require.Contains(t, fmt.Sprint(got["content"]), "type:resource")
	})

	t.Run("structured content intact", func(t *testing.T) {
		want, got := callBoth(t, "get-structured-content", map[string]any{"location": "Chicago"})
		require.Equal(t, want, got)
		require.Equal(t, map[string]any{"temperature": 36.0, "conditions": "Light rain / drizzle", "humidity": 82.0}, got["structuredContent"])
	})

	t.Run("resources/list and resources/read, text and blob", func(t *testing.T) {
		want := decoded(t, d.call(t, "resources/list", map[string]any{}))
		got := decoded(t, gatewayCall(t, gw, "resources/list", "", nil))
		require.Equal(t, want, got)
		resources := got["resources"].([]any)
		require.NotEmpty(t, resources)
		for _, r := range resources {
			uri := r.(map[string]any)["uri"].(string)
			require.Equal(t, decoded(t, d.call(t, "resources/read", map[string]any{"uri": uri})),
				decoded(t, gatewayCall(t, gw, "resources/read", uri, map[string]any{"uri": uri})), uri)
		}
		for _, uri := range []string{"demo://resource/dynamic/text/3", "demo://resource/dynamic/blob/4"} {
			want := decoded(t, d.call(t, "resources/read", map[string]any{"uri": uri}))
			got := decoded(t, gatewayCall(t, gw, "resources/read", uri, map[string]any{"uri": uri}))
			require.Equal(t, untimed(want), untimed(got), uri)
		}
		blob := decoded(t, gatewayCall(t, gw, "resources/read", "demo://resource/dynamic/blob/4", map[string]any{"uri": "demo://resource/dynamic/blob/4"}))
		require.Contains(t, fmt.Sprint(untimed(blob)), "blob:Resource 4: This is a base64 blob")
	})

	t.Run("prompts/list and prompts/get", func(t *testing.T) {
		want := byName(t, d.call(t, "prompts/list", map[string]any{}), "prompts", "")
		got := byName(t, gatewayCall(t, gw, "prompts/list", "", nil), "prompts", everythingPrefix)
		// An argument's "required": false is its default; the gateway's
		// SDK omits it.
		for _, p := range want {
			args, _ := p["arguments"].([]any)
			for _, a := range args {
				if a := a.(map[string]any); a["required"] == false {
					delete(a, "required")
				}
			}
		}
		require.Equal(t, want, got)
		for _, p := range []struct {
			name string
			args map[string]any
		}{
			{"simple-prompt", nil},
			{"args-prompt", map[string]any{"city": "Lisbon", "state": "Lisboa"}},
			{"resource-prompt", map[string]any{"resourceType": "Text", "resourceId": "5"}},
		} {
			params := map[string]any{"name": p.name}
			if p.args != nil {
				params["arguments"] = p.args
			}
			want := decoded(t, d.call(t, "prompts/get", params))
			params = map[string]any{"name": everythingPrefix + p.name}
			if p.args != nil {
				params["arguments"] = p.args
			}
			got := decoded(t, gatewayCall(t, gw, "prompts/get", everythingPrefix+p.name, params))
			require.Equal(t, untimed(want), untimed(got), p.name)
		}
	})

	t.Run("a tool that changes the server waits for an approval; denied it does not run, approved it runs once", func(t *testing.T) {
		toggle := func() string {
			r, err := gw.CallTool(context.Background(), everythingPrefix+"toggle-simulated-logging", map[string]any{}, nil)
			require.NoError(t, err)
			require.Equal(t, tasks.ResultTypeTask, r.ResultType, "%s", r.Raw)
			return r.Task.TaskID
		}
		denied := toggle()
		require.Equal(t, 200, s.decide(s.requestOf(denied), "deny"))
		task := s.waitTask(gw, denied)
		_, m, isErr := resultText(t, task)
		require.True(t, isErr)
		require.Equal(t, "denied-not-executed", m["io.modelcontextprotocol/tool-approval-disposition"])

		approved := toggle()
		require.Equal(t, 200, s.decide(s.requestOf(approved), "approve"))
		task = s.waitTask(gw, approved)
		text, m, isErr := resultText(t, task)
		require.False(t, isErr, "%s", task.Result)
		require.Equal(t, "approved-executed", m["io.modelcontextprotocol/tool-approval-disposition"])
		// The tool toggles per upstream session: "Started" means the
		// denied call never reached the server (else this one would have
		// stopped what it started).
		require.Contains(t, text, "Started simulated, random-leveled logging")
	})

	t.Run("progress of a long-running tool reaches the caller's progressToken", func(t *testing.T) {
		r, err := gw.Call(context.Background(), "tools/call", everythingPrefix+"trigger-long-running-operation", map[string]any{
			"name": everythingPrefix + "trigger-long-running-operation", "arguments": map[string]any{"duration": 1, "steps": 3},
			"_meta": map[string]any{"progressToken": "e2e-progress"},
		})
		require.NoError(t, err)
		require.Nil(t, r.Error, "%s", r.Raw)
		var progress []float64
		for _, m := range sseData(r.Raw) {
			var n struct {
				Method string `json:"method"`
				Params struct {
					ProgressToken any     `json:"progressToken"`
					Progress      float64 `json:"progress"`
					Total         float64 `json:"total"`
				} `json:"params"`
			}
			require.NoError(t, json.Unmarshal(m, &n))
			if n.Method == "notifications/progress" {
				require.Equal(t, "e2e-progress", n.Params.ProgressToken)
				require.Equal(t, 3.0, n.Params.Total)
				progress = append(progress, n.Params.Progress)
			}
		}
		require.Equal(t, []float64{1, 2, 3}, progress, "%s", r.Raw)
		require.Contains(t, string(r.Result), "Long running operation completed")
	})
}
