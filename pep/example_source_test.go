package pep_test

import (
	"context"
	"errors"
	"fmt"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/omcp/arap/pep"
)

// remote stands in for a client of an upstream MCP server: its tools as it
// last listed them, and a call that says whether the request may have been
// sent when it fails.
type remote struct {
	name  string
	tools []*sdk.Tool
}

var errNotSent = errors.New("dial: connection refused")

func (r *remote) call(_ context.Context, tool string, _ map[string]any) (*sdk.CallToolResult, bool, error) {
	return nil, false, errNotSent
}

// remoteSource offers r's tools through the gate, exposed as <server>_<tool>.
type remoteSource struct{ r *remote }

func (s remoteSource) Tools() []pep.Tool {
	out := make([]pep.Tool, 0, len(s.r.tools))
	for _, t := range s.r.tools {
		in, _ := t.InputSchema.(map[string]any)
		outSchema, _ := t.OutputSchema.(map[string]any)
		upstreamTool := t.Name
		out = append(out, pep.Tool{
			Name: s.r.name + "_" + t.Name, Title: t.Title, Description: t.Description,
			InputSchema: in, OutputSchema: outSchema, Annotations: t.Annotations,
			Upstream: s.r.name, UpstreamTool: upstreamTool,
			// Digest left empty: the gate computes pep.ToolDigest. A source
			// that sets it must cover the whole definition with it.
			Run: func(ctx context.Context, x pep.Invocation) (pep.Output, error) {
				res, maybeSent, err := s.r.call(ctx, upstreamTool, x.Args)
				if err != nil {
					// What the client may read: no URL, no credential.
					return pep.Output{}, &pep.UpstreamError{Upstream: s.r.name, Message: "unreachable", MaybeRan: maybeSent, Err: err}
				}
				return pep.Output{Content: res.Content, Structured: res.StructuredContent, IsError: res.IsError}, nil
			},
		})
	}
	return out
}

// A source adapts an upstream MCP server's tools for the gate: definitions
// as the server gives them, its name and the tool's name there, and a Run
// whose failures say whether the request may have reached the tool. Pass it
// in pep.Config.Sources (frontend.Config.Sources).
func Example_toolSource() {
	yes := true
	r := &remote{name: "db", tools: []*sdk.Tool{{Name: "drop", Description: "Drop a table.",
		InputSchema: map[string]any{"type": "object"}, Annotations: &sdk.ToolAnnotations{DestructiveHint: &yes}}}}
	var src pep.ToolSource = remoteSource{r}
	for _, t := range src.Tools() {
		_, err := t.Run(context.Background(), pep.Invocation{})
		var ue *pep.UpstreamError
		fmt.Println(t.Name, t.Upstream, t.UpstreamTool, errors.As(err, &ue) && !ue.MaybeRan)
	}
	// Output: db_drop db drop true
}
