package pep

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/omcp/arap/upstream"
)

// Upstreams offers the tools of upstream MCP servers (package upstream) as
// a ToolSource: the registry's current tools, each forwarding its call to
// its upstream at most once. A definition is converted (and its digest
// taken) once, when the registry's tool set changes, not on every call.
type Upstreams struct {
	reg     *upstream.Registry
	metrics *Metrics

	mu    sync.Mutex
	from  []upstream.Tool // the registry's tools that tools was made from
	tools []Tool
}

// NewUpstreams is reg as a ToolSource; m (may be nil) observes every
// upstream request.
func NewUpstreams(reg *upstream.Registry, m *Metrics) *Upstreams {
	return &Upstreams{reg: reg, metrics: m}
}

// Tools implements ToolSource.
func (u *Upstreams) Tools() []Tool {
	cur := u.reg.Tools()
	u.mu.Lock()
	defer u.mu.Unlock()
	if sameDefinitions(cur, u.from) {
		return u.tools
	}
	tools := make([]Tool, 0, len(cur))
	for _, t := range cur {
		pt, err := u.tool(t)
		if err != nil {
			continue // a definition this server cannot take is not offered
		}
		tools = append(tools, pt)
	}
	u.from, u.tools = cur, tools
	return tools
}

// Connected implements Connector: an upstream of the file that is not
// connected now (starting, reconnecting, or the registry closed) is not.
func (u *Upstreams) Connected(upstream string) bool { return u.reg.Settled(upstream) }

func sameDefinitions(a, b []upstream.Tool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || a[i].Digest != b[i].Digest || a[i].TaskRequired != b[i].TaskRequired ||
			a[i].Upstream != b[i].Upstream || a[i].UpstreamTool != b[i].UpstreamTool {
			return false
		}
	}
	return true
}

// tool is t as the gate offers it.
func (u *Upstreams) tool(t upstream.Tool) (Tool, error) {
	in, err := schemaMap(t.Def.InputSchema)
	if err != nil {
		return Tool{}, err
	}
	out, err := schemaMap(t.Def.OutputSchema)
	if err != nil {
		return Tool{}, err
	}
	pt := Tool{
		Name: t.Name, Title: t.Def.Title, Description: t.Def.Description,
		InputSchema: in, OutputSchema: out, Annotations: t.Def.Annotations,
		Upstream: t.Upstream, UpstreamTool: t.UpstreamTool, TaskRequired: t.TaskRequired,
	}
	if pt.Digest, err = ToolDigest(pt); err != nil {
		return Tool{}, err
	}
	// The call names the definition it was decided on: one that changed
	// upstream after the gate's last look is not sent.
	opts := &upstream.CallOptions{Digest: t.Digest, Upstream: t.Upstream, UpstreamTool: t.UpstreamTool}
	upstreamName := t.Upstream
	pt.Run = func(ctx context.Context, x Invocation) (Output, error) {
		o := *opts
		o.Progress, o.Log, o.Meta, o.RequestState, o.InputResponses = x.Progress, x.Log, x.Meta, x.RequestState, x.InputResponses
		start := time.Now()
		res, err := u.reg.Call(ctx, t.Name, x.Args, &o)
		u.metrics.ObserveUpstream(upstreamName, time.Since(start), err)
		return upstreamOutput(upstreamName, res, err)
	}
	return pt, nil
}

// maxUpstreamState bounds an upstream's requestState, which the gateway
// carries (sealed inside its own) to the caller and back.
const maxUpstreamState = 16 << 10

// upstreamOutput maps an upstream call's result or failure to what the
// gate records: a result (tool errors included) as it came; an answer that
// is a JSON-RPC error as a tool error (the upstream answered, so the call
// may have had effects: never "did not run"); no answer as an
// UpstreamError that says whether the request may have reached the tool.
func upstreamOutput(name string, res *sdk.CallToolResult, err error) (Output, error) {
	var ue *upstream.Error
	switch {
	case err == nil && res.NeedsInput() && len(res.RequestState) > maxUpstreamState:
		return Output{Text: fmt.Sprintf("Upstream %s asked for more input with a requestState over %d bytes, which the gateway does not relay; the tool did not finish, and it may have had effects before asking.", name, maxUpstreamState), IsError: true}, nil
	case err == nil && res.NeedsInput():
		return Output{Input: &UpstreamInput{Requests: res.InputRequests, State: res.RequestState}}, nil
	case err == nil:
		return Output{Content: res.Content, Structured: res.StructuredContent, IsError: res.IsError}, nil
	case errors.As(err, &ue) && ue.Kind == upstream.Rejected:
		return Output{Text: fmt.Sprintf("Upstream %s answered with an error: %s", name, ue.Reason), IsError: true, Rejected: ue.RPC}, nil
	case errors.As(err, &ue):
		return Output{}, &UpstreamError{Upstream: name, Message: ue.Reason, MaybeRan: ue.Kind != upstream.NotSent, Transient: ue.Transient(), Err: err}
	default:
		return Output{}, &UpstreamError{Upstream: name, Message: "the call failed", MaybeRan: true, Err: err}
	}
}

// schemaMap is a JSON Schema as the SDK client decoded it, as a map.
func schemaMap(s any) (map[string]any, error) {
	if s == nil {
		return nil, nil
	}
	if m, ok := s.(map[string]any); ok {
		return m, nil
	}
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	return m, nil
}
