package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// startOffering is a real go-sdk server on loopback offering resources, a
// resource template, prompts and completions besides the usual tools. What
// it was asked is recorded so tests see the names the upstream received.
func startOffering(t *testing.T, stateless bool) (*mcpServer, *offerLog) {
	t.Helper()
	l := &offerLog{}
	srv := mcp.NewServer(&mcp.Implementation{Name: "offering", Version: "1"}, &mcp.ServerOptions{
		CompletionHandler: func(_ context.Context, req *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
			l.completeRef.Store(req.Params.Ref)
			return &mcp.CompleteResult{Completion: mcp.CompletionResultDetails{Values: []string{req.Params.Argument.Value + "-done"}, Total: 1}}, nil
		},
	})
	srv.AddResource(&mcp.Resource{URI: "test://static", Name: "static", MIMEType: "text/plain"},
		func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			l.reads.Add(1)
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, Text: "static text"}}}, nil
		})
	srv.AddResource(&mcp.Resource{URI: "test://refuse", Name: "refuse"},
		func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "no; you sent Bearer " + testToken}
		})
	srv.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: "test://item/{id}", Name: "item"},
		func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			l.reads.Add(1)
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, Text: "item " + req.Params.URI}}}, nil
		})
	srv.AddPrompt(&mcp.Prompt{Name: "greet", Arguments: []*mcp.PromptArgument{{Name: "who", Required: true}}},
		func(_ context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			l.promptName.Store(req.Params.Name)
			return &mcp.GetPromptResult{Messages: []*mcp.PromptMessage{{Role: "user", Content: &mcp.TextContent{Text: "hello " + req.Params.Arguments["who"]}}}}, nil
		})
	srv.AddTool(&mcp.Tool{Name: "needs_input", InputSchema: map[string]any{"type": "object"}},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			if a, ok := req.Params.InputResponses["q"].(*mcp.ElicitResult); ok {
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "answered " + req.Params.RequestState + " " + a.Action}}}, nil
			}
			return &mcp.CallToolResult{RequestState: "s", InputRequests: mcp.InputRequestMap{"q": &mcp.ElicitParams{Message: "which?"}}}, nil
		})
	s := &mcpServer{t: t, srv: srv, stateless: stateless, entered: make(chan struct{}, 10), release: make(chan struct{}), progress: make(chan struct{})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s.addr = ln.Addr().String()
	s.serve(ln)
	t.Cleanup(s.stop)
	return s, l
}

type offerLog struct {
	reads       atomic.Int32
	promptName  atomic.Value // string
	completeRef atomic.Value // *mcp.CompleteReference
}

// TestOffers: resources, templates, prompts and completions are offered
// from the upstream whose capabilities say so, each request routed to it
// (resources by URI, prompts by exposed name, completions by their ref) and
// typed like a tool call when it fails; an upstream that offers only tools
// offers nothing else.
func TestOffers(t *testing.T) {
	for _, stateless := range []bool{true, false} {
		t.Run(fmt.Sprintf("stateless=%v", stateless), func(t *testing.T) {
			t.Parallel()
			a, log := startOffering(t, stateless)
			r := newRegistry(t, Options{})
			require.NoError(t, r.Reload(context.Background(), httpConfig(t, "    prefix: a_\n", map[string]*mcpServer{"a": a})))
			waitReady(t, r, "a")
			ctx := context.Background()

			// Logging too: the go-sdk server offers it by default, and its
			// messages reach clients over HTTP.
			require.Equal(t, Offers{Resources: true, Prompts: true, Completions: true, Logging: true}, r.Offered())
			var uris []string
			for _, res := range r.Resources() {
				require.Equal(t, "a", res.Upstream)
				uris = append(uris, res.Def.URI)
			}
			require.ElementsMatch(t, []string{"test://static", "test://refuse"}, uris, "URIs are not prefixed")
			require.Len(t, r.Templates(), 1)
			require.Equal(t, "test://item/{id}", r.Templates()[0].Def.URITemplate)
			require.Len(t, r.Prompts(), 1)
			require.Equal(t, "a_greet", r.Prompts()[0].Name, "prompts are exposed under the prefix, like tools")
			require.Equal(t, "a_greet", r.Prompts()[0].Exposed().Name)
			require.Equal(t, "greet", r.Prompts()[0].Def.Name, "the definition is not modified")

			res, err := r.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://static"}, nil)
			require.NoError(t, err)
			require.Equal(t, "static text", res.Contents[0].Text)
			res, err = r.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://item/42"}, nil)
			require.NoError(t, err, "a URI matching a template goes to its upstream")
			require.Equal(t, "item test://item/42", res.Contents[0].Text)

			_, err = r.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://elsewhere"}, nil)
			ue := requireKind(t, err, NotSent)
			require.ErrorIs(t, err, ErrNotOffered)
			require.Empty(t, ue.Upstream)
			require.Equal(t, int32(2), log.reads.Load(), "a URI no upstream offers is sent nowhere")
			// Decided for another upstream (a reload moved it since): not sent.
			_, err = r.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://static"}, &CallOptions{Upstream: "b"})
			requireKind(t, err, NotSent)
			require.ErrorIs(t, err, ErrToolChanged)
			_, err = r.GetPrompt(ctx, &mcp.GetPromptParams{Name: "a_greet"}, &CallOptions{Upstream: "b"})
			require.ErrorIs(t, err, ErrToolChanged)
			_, err = r.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/prompt", Name: "a_greet"},
				Argument: mcp.CompleteParamsArgument{Name: "who", Value: "b"}}, &CallOptions{Upstream: "b"})
			require.ErrorIs(t, err, ErrToolChanged)
			require.Equal(t, int32(2), log.reads.Load(), "nothing went to the upstream not decided on")
			require.Nil(t, log.promptName.Load())
			require.Nil(t, log.completeRef.Load())

			_, err = r.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://refuse"}, nil)
			ue = requireKind(t, err, Rejected)
			require.Equal(t, int64(jsonrpc.CodeInvalidParams), ue.Code)
			require.Contains(t, err.Error(), `upstream "a", resource "test://refuse"`)
			require.NotContains(t, err.Error(), testToken)
			require.NotContains(t, err.Error(), a.addr)

			pr, err := r.GetPrompt(ctx, &mcp.GetPromptParams{Name: "a_greet", Arguments: map[string]string{"who": "bob"}}, nil)
			require.NoError(t, err)
			require.Equal(t, "hello bob", pr.Messages[0].Content.(*mcp.TextContent).Text)
			require.Equal(t, "greet", log.promptName.Load(), "the upstream is asked under its own name")
			_, err = r.GetPrompt(ctx, &mcp.GetPromptParams{Name: "greet"}, nil)
			requireKind(t, err, NotSent)
			require.ErrorIs(t, err, ErrNotOffered)

			cr, err := r.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/prompt", Name: "a_greet"},
				Argument: mcp.CompleteParamsArgument{Name: "who", Value: "b"}}, nil)
			require.NoError(t, err)
			require.Equal(t, []string{"b-done"}, cr.Completion.Values)
			require.Equal(t, "greet", log.completeRef.Load().(*mcp.CompleteReference).Name)
			_, err = r.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/resource", URI: "test://item/{id}"},
				Argument: mcp.CompleteParamsArgument{Name: "id", Value: "4"}}, nil)
			require.NoError(t, err)
			require.Equal(t, "test://item/{id}", log.completeRef.Load().(*mcp.CompleteReference).URI)
			_, err = r.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/prompt", Name: "nope"},
				Argument: mcp.CompleteParamsArgument{Name: "who"}}, nil)
			requireKind(t, err, NotSent)

			// A tool's question (MRTR) comes back as it came, for the gate to
			// relay; the retry carries the upstream's state and the answers.
			// (A 2025-11-25 upstream asks the gateway's session itself,
			// which cannot answer: refused.)
			tr, err := r.Call(ctx, "a_needs_input", nil, nil)
			if stateless {
				require.NoError(t, err)
				require.True(t, tr.NeedsInput())
				require.Contains(t, tr.InputRequests, "q")
				require.Equal(t, "s", tr.RequestState)
				tr, err = r.Call(ctx, "a_needs_input", nil, &CallOptions{RequestState: "s",
					InputResponses: mcp.InputResponseMap{"q": &mcp.ElicitResult{Action: "accept", Content: map[string]any{"x": "y"}}}})
				require.NoError(t, err)
				require.False(t, tr.NeedsInput())
				require.Equal(t, "answered s accept", tr.Content[0].(*mcp.TextContent).Text)
			} else {
				requireKind(t, err, Rejected)
			}

			// Down: NotSent, naming the upstream, not where it is.
			a.stop()
			// The first read may go out on a pooled connection that the stop
			// reset after the write (MaybeSent); it makes the loop notice.
			_, err = r.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://static"}, nil)
			require.Error(t, err)
			require.NotContains(t, err.Error(), a.addr)
			require.Eventually(t, func() bool { return r.Ready()["a"] != nil }, 10*time.Second, 10*time.Millisecond)
			_, err = r.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://static"}, nil)
			ue = requireKind(t, err, NotSent)
			require.Equal(t, "a", ue.Upstream)
			require.NotContains(t, err.Error(), a.addr)
			_, err = r.GetPrompt(ctx, &mcp.GetPromptParams{Name: "a_greet"}, nil)
			requireKind(t, err, NotSent)
		})
	}
}

// TestOffersToolsOnly: an upstream whose capabilities offer only tools
// offers nothing else, and nothing else is asked of it.
func TestOffersToolsOnly(t *testing.T) {
	t.Parallel()
	s := startServer(t, serverOpts{stateless: true})
	r := newRegistry(t, Options{})
	require.NoError(t, r.Reload(context.Background(), httpConfig(t, "", map[string]*mcpServer{"svc": s})))
	waitReady(t, r, "svc")
	require.Equal(t, Offers{Logging: true}, r.Offered(), "tools, and the logging the SDK offers by default")
	require.Empty(t, r.Resources())
	require.Empty(t, r.Prompts())
	_, err := r.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "test://static"}, nil)
	require.True(t, errors.Is(err, ErrNotOffered), "%v", err)
}
