package pep

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/upstream"
)

// Resources, prompts and completions of the upstreams pass through the
// gateway: each offered as its upstream lists it (resources under their URI,
// prompts under the upstream's prefix), advertised only while some upstream
// offers the feature, and every resources/read, prompts/get and
// completion/complete decided by the PDP before it is forwarded. Only allow
// forwards: these requests have no approval flow (no task to wait on), so a
// requestable denial is refused like any other, and says so.

// passthrough keeps the SDK server's resources, templates and prompts the
// registry's current ones.
type passthrough struct {
	reg *upstream.Registry

	mu        sync.Mutex
	resources map[string]*sdk.Resource         // URI -> as registered
	templates map[string]*sdk.ResourceTemplate // URI template -> as registered
	prompts   map[string]*sdk.Prompt           // exposed name -> as registered
}

// offered says what is advertised and served now.
func (s *Server) offered() upstream.Offers {
	if s.pass == nil {
		return upstream.Offers{}
	}
	return s.pass.reg.Offered()
}

// served reports whether method belongs to a feature some upstream offers
// now (always false for resources/subscribe and resources/unsubscribe: a
// 2026-07-28 client subscribes on its listen stream, changes.go).
func (s *Server) served(method string) bool {
	o := s.offered()
	switch method {
	case "resources/list", "resources/read", "resources/templates/list":
		return o.Resources
	case "prompts/list", "prompts/get":
		return o.Prompts
	case "completion/complete":
		return o.Completions
	}
	return false
}

// advertise makes the capabilities of an initialize or server/discover
// result say exactly what is offered now: the SDK advertises resources or
// prompts when it has some registered and completions whenever the handler
// is set, which is not the same thing.
func (s *Server) advertise(res sdk.Result) {
	var caps *sdk.ServerCapabilities
	switch r := res.(type) {
	case *sdk.InitializeResult:
		caps = r.Capabilities
	case *sdk.DiscoverResult:
		caps = r.Capabilities
	}
	if caps == nil {
		return
	}
	o := s.offered()
	caps.Resources, caps.Prompts, caps.Completions, caps.Logging = nil, nil, nil, nil
	if o.Resources {
		caps.Resources = &sdk.ResourceCapabilities{ListChanged: true}
	}
	if _, discover := res.(*sdk.DiscoverResult); discover {
		// A 2026-07-28 client opts in on a listen stream (changes.go); a
		// 2025-11-25 client has no session to carry changes on this
		// stateless server, so it is promised none beyond what it was.
		if caps.Tools != nil && s.pass != nil { // only upstreams' tools change
			caps.Tools.ListChanged = true
		}
		if caps.Resources != nil {
			caps.Resources.Subscribe = o.Subscribe
		}
	}
	if o.Prompts {
		caps.Prompts = &sdk.PromptCapabilities{ListChanged: true}
	}
	if o.Completions {
		caps.Completions = &sdk.CompletionCapabilities{}
	}
	if o.Logging {
		caps.Logging = &sdk.LoggingCapabilities{}
	}
}

// syncOffers registers the registry's current resources, templates and
// prompts on the SDK server (which lists them, matches a read's URI and
// answers not-found for anything else) and removes those gone.
func (s *Server) syncOffers() {
	p := s.pass
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := map[string]*sdk.Resource{}
	for _, r := range p.reg.Resources() {
		if old, ok := p.resources[r.Def.URI]; ok && reflect.DeepEqual(old, r.Def) {
			now[r.Def.URI] = old
			continue
		}
		if err := safely(func() { s.sdk.AddResource(r.Def, s.readResource) }); err != nil {
			s.log.Warn("resource not offered", "upstream", r.Upstream, "error", err.Error())
			continue
		}
		now[r.Def.URI] = r.Def
	}
	var gone []string
	for uri := range p.resources {
		if _, ok := now[uri]; !ok {
			gone = append(gone, uri)
		}
	}
	s.sdk.RemoveResources(gone...)
	resChanged := !maps.Equal(p.resources, now)
	p.resources = now

	tnow := map[string]*sdk.ResourceTemplate{}
	for _, t := range p.reg.Templates() {
		if old, ok := p.templates[t.Def.URITemplate]; ok && reflect.DeepEqual(old, t.Def) {
			tnow[t.Def.URITemplate] = old
			continue
		}
		if err := safely(func() { s.sdk.AddResourceTemplate(t.Def, s.readResource) }); err != nil {
			s.log.Warn("resource template not offered", "upstream", t.Upstream, "error", err.Error())
			continue
		}
		tnow[t.Def.URITemplate] = t.Def
	}
	gone = gone[:0]
	for u := range p.templates {
		if _, ok := tnow[u]; !ok {
			gone = append(gone, u)
		}
	}
	s.sdk.RemoveResourceTemplates(gone...)
	resChanged = resChanged || !maps.Equal(p.templates, tnow)
	p.templates = tnow

	pnow := map[string]*sdk.Prompt{}
	for _, pr := range p.reg.Prompts() {
		def := pr.Exposed()
		if old, ok := p.prompts[pr.Name]; ok && reflect.DeepEqual(old, def) {
			pnow[pr.Name] = old
			continue
		}
		if err := safely(func() { s.sdk.AddPrompt(def, s.getPrompt) }); err != nil {
			s.log.Warn("prompt not offered", "upstream", pr.Upstream, "error", err.Error())
			continue
		}
		pnow[pr.Name] = def
	}
	gone = gone[:0]
	for n := range p.prompts {
		if _, ok := pnow[n]; !ok {
			gone = append(gone, n)
		}
	}
	s.sdk.RemovePrompts(gone...)
	promptsChanged := !maps.Equal(p.prompts, pnow)
	p.prompts = pnow
	if resChanged {
		s.changes.listChanged(tasks.NotificationResourcesListChanged)
	}
	if promptsChanged {
		s.changes.listChanged(tasks.NotificationPromptsListChanged)
	}
}

// safely runs an SDK registration, which panics on a definition it cannot
// take (an upstream's).
func safely(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	f()
	return nil
}

// principalOf is the caller's principal, as authenticate recorded it; the
// zero Principal when there is none.
func principalOf(extra *sdk.RequestExtra) Principal {
	var p Principal
	if extra != nil && extra.TokenInfo != nil {
		p, _ = extra.TokenInfo.Extra["principal"].(Principal)
	}
	return p
}

// forward runs one passed-through request, decided for upstream up, and
// observes it in the upstream metric like a tool call. The request goes
// to up or nowhere (a reload that moved it meanwhile: not sent), with the
// upstream's progress and log messages relayed on the caller's stream.
func forward[R any](ctx context.Context, s *Server, up string, req sdk.Request, do func(*upstream.CallOptions) (R, error)) (R, error) {
	o := &upstream.CallOptions{Upstream: up}
	o.Progress, o.Log = relays(ctx, sessionOf(req), req.GetParams().GetMeta())
	start := time.Now()
	res, err := do(o)
	s.gate.cfg.Metrics.ObserveUpstream(up, time.Since(start), err)
	return res, s.forwardError(err)
}

func sessionOf(req sdk.Request) *sdk.ServerSession {
	ss, _ := req.GetSession().(*sdk.ServerSession)
	return ss
}

// readResource decides a resources/read and, if allowed, forwards it to the
// upstream that offers the URI.
func (s *Server) readResource(ctx context.Context, req *sdk.ReadResourceRequest) (*sdk.ReadResourceResult, error) {
	up, ok := s.pass.reg.ResourceOwner(req.Params.URI)
	if !ok {
		return nil, sdk.ResourceNotFoundError(req.Params.URI)
	}
	if err := s.decide(ctx, principalOf(req.Extra), readEvaluation(req.Params.URI, up), "reading resource "+req.Params.URI); err != nil {
		return nil, err
	}
	return forward(ctx, s, up, req, func(o *upstream.CallOptions) (*sdk.ReadResourceResult, error) {
		return s.pass.reg.ReadResource(ctx, req.Params, o)
	})
}

// readEvaluation is the PDP request (without its subject) for reading uri
// from upstream up: a resources/read, and a subscription to uri.
func readEvaluation(uri, up string) authzen.EvaluationRequest {
	return authzen.EvaluationRequest{
		Action:   authzen.Object{"name": ActionReadResource},
		Resource: authzen.Object{"type": ResourceTypeResource, "id": uri, "properties": map[string]any{"upstream": up}},
	}
}

// getPrompt decides a prompts/get and, if allowed, forwards it.
func (s *Server) getPrompt(ctx context.Context, req *sdk.GetPromptRequest) (*sdk.GetPromptResult, error) {
	pr, ok := s.pass.reg.PromptByName(req.Params.Name)
	if !ok {
		return nil, rpcError(tasks.CodeInvalidParams, fmt.Sprintf("unknown prompt %q", req.Params.Name))
	}
	args := map[string]any{}
	for k, v := range req.Params.Arguments {
		args[k] = v
	}
	ev := authzen.EvaluationRequest{
		Action: authzen.Object{"name": ActionGetPrompt},
		Resource: authzen.Object{"type": ResourceTypePrompt, "id": pr.Name,
			"properties": map[string]any{"upstream": pr.Upstream, "upstream_prompt": pr.UpstreamPrompt, "arguments": args}},
	}
	if err := s.decide(ctx, principalOf(req.Extra), ev, fmt.Sprintf("getting prompt %q", pr.Name)); err != nil {
		return nil, err
	}
	return forward(ctx, s, pr.Upstream, req, func(o *upstream.CallOptions) (*sdk.GetPromptResult, error) {
		return s.pass.reg.GetPrompt(ctx, req.Params, o)
	})
}

// complete decides a completion/complete, as a request about its ref (the
// prompt or the resource), and if allowed forwards it.
func (s *Server) complete(ctx context.Context, req *sdk.CompleteRequest) (*sdk.CompleteResult, error) {
	if !s.offered().Completions {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "method not found: completion/complete"}
	}
	ref := req.Params.Ref
	up, upRef, ok := s.pass.reg.CompletionOwner(ref)
	if !ok {
		return nil, rpcError(tasks.CodeInvalidParams, "no upstream offers completions for this reference")
	}
	props := map[string]any{"upstream": up, "argument": map[string]any{"name": req.Params.Argument.Name, "value": req.Params.Argument.Value}}
	if req.Params.Context != nil && len(req.Params.Context.Arguments) > 0 {
		ctxArgs := map[string]any{}
		for k, v := range req.Params.Context.Arguments {
			ctxArgs[k] = v
		}
		props["arguments"] = ctxArgs
	}
	res := authzen.Object{"type": ResourceTypeResource, "id": ref.URI, "properties": props}
	if ref.Type == "ref/prompt" {
		props["upstream_prompt"] = upRef
		res = authzen.Object{"type": ResourceTypePrompt, "id": ref.Name, "properties": props}
	}
	ev := authzen.EvaluationRequest{Action: authzen.Object{"name": ActionComplete}, Resource: res}
	if err := s.decide(ctx, principalOf(req.Extra), ev, "completion"); err != nil {
		return nil, err
	}
	return forward(ctx, s, up, req, func(o *upstream.CallOptions) (*sdk.CompleteResult, error) {
		return s.pass.reg.Complete(ctx, req.Params, o)
	})
}

// decide asks the PDP about ev for p: nil if allowed, else the JSON-RPC
// error the caller gets. Nothing is forwarded unless the decision is allow.
func (s *Server) decide(ctx context.Context, p Principal, ev authzen.EvaluationRequest, what string) error {
	if p.SubjectID == "" {
		return rpcError(tasks.CodeInvalidParams, "unauthenticated")
	}
	ev.Subject = p.Subject()
	d, err := s.gate.evaluate(ctx, ev)
	if err != nil {
		return err
	}
	if d.Decision {
		return nil
	}
	if _, requestable := d.AccessRequest(); requestable {
		return rpcError(tasks.CodeInvalidParams, "Not allowed by policy: "+what+" needs an approval, and approvals can only be requested for tool calls; nothing was sent upstream.")
	}
	return rpcError(tasks.CodeInvalidParams, "Not allowed by policy: "+what+"; nothing was sent upstream.")
}

// forwardError is the JSON-RPC error for a forwarded request that failed:
// an upstream's own error keeps its code; a request that never left or
// whose answer was lost is an internal error naming the upstream. The
// message never holds the upstream's address or credential (package
// upstream's promise); the cause goes to the log only by kind.
func (s *Server) forwardError(err error) error {
	if err == nil {
		return nil
	}
	var ue *upstream.Error
	if !errors.As(err, &ue) {
		s.log.Warn("upstream request failed")
		return rpcError(tasks.CodeInternalError, "the upstream request failed")
	}
	if ue.Kind == upstream.Rejected && ue.RPC != nil {
		return ue.RPC // as the upstream answered it
	}
	if ue.Kind == upstream.Rejected {
		return &jsonrpc.Error{Code: ue.Code, Message: ue.Error()}
	}
	s.log.Warn("upstream request failed", "upstream", ue.Upstream, "what", ue.Reason)
	return rpcError(tasks.CodeInternalError, ue.Error())
}
