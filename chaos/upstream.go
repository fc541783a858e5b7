package chaos

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Upstream tools (behind arapd mcp with prefix "up_"): pay is approval-gated
// by the chaos policy, note is allowed, forbidden falls to the default deny.
const (
	ToolPay       = "pay"
	ToolNote      = "note"
	ToolForbidden = "forbidden"
	upstreamName  = "chaos"
	upstreamPfx   = "up_"
)

// Execution is one run of an upstream tool, as the upstream saw it: the
// side effect the checker judges, kept in the chaos process, which outlives
// every arap process and PostgreSQL restart.
type Execution struct {
	CallID string    `json:"call_id"`
	Tool   string    `json:"tool"`
	At     time.Time `json:"at"`
}

// upstream is an in-process streamable HTTP MCP server whose tools record
// each execution keyed by the client-chosen call_id in their arguments.
type upstream struct {
	mu    sync.Mutex
	execs []Execution
	srv   *http.Server
	addr  string
}

func startUpstream() (*upstream, error) {
	u := &upstream{}
	s := mcp.NewServer(&mcp.Implementation{Name: "chaos-upstream", Version: "1"}, nil)
	schema := map[string]any{"type": "object", "required": []any{"call_id"}, "properties": map[string]any{
		"call_id": map[string]any{"type": "string"}, "amount": map[string]any{"type": "number"}}}
	for _, name := range []string{ToolPay, ToolNote, ToolForbidden} {
		s.AddTool(&mcp.Tool{Name: name, InputSchema: schema}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var args struct {
				CallID string `json:"call_id"`
			}
			_ = jsonUnmarshal(req.Params.Arguments, &args)
			u.mu.Lock()
			u.execs = append(u.execs, Execution{CallID: args.CallID, Tool: name, At: time.Now()})
			u.mu.Unlock()
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("%s done for %s", name, args.CallID)}}}, nil
		})
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u.addr = ln.Addr().String()
	u.srv = &http.Server{Handler: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true}),
		ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = u.srv.Serve(ln) }()
	return u, nil
}

func (u *upstream) executions() []Execution {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]Execution(nil), u.execs...)
}

func (u *upstream) close() { _ = u.srv.Close() }
