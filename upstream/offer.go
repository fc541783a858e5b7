package upstream

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/yosida95/uritemplate/v3"
)

// Offers is what an upstream offers besides tools, from the capabilities in
// its initialize result.
type Offers struct {
	Resources, Prompts, Completions bool
	// Logging: an upstream whose log messages reach clients (one over
	// HTTP: a stdio upstream's cannot be told apart by request).
	Logging bool
	// Subscribe: an upstream that offers resources also takes
	// subscriptions to them (notifications/resources/updated).
	Subscribe bool
}

func offersOf(c *mcp.ServerCapabilities, overHTTP bool) Offers {
	if c == nil {
		return Offers{}
	}
	return Offers{Resources: c.Resources != nil, Prompts: c.Prompts != nil, Completions: c.Completions != nil,
		Logging: c.Logging != nil && overHTTP, Subscribe: c.Resources != nil && c.Resources.Subscribe}
}

// Resource is one resource the gateway offers, under the upstream's URI
// (URIs are not prefixed: they name the thing, and a client may know them
// from elsewhere).
type Resource struct {
	Upstream string
	Def      *mcp.Resource // as the upstream listed it; shared, do not modify
}

// Template is one resource template the gateway offers.
type Template struct {
	Upstream string
	Def      *mcp.ResourceTemplate // shared, do not modify
	re       interface{ MatchString(string) bool }
}

// Prompt is one prompt the gateway offers, under the upstream's prefix like
// a tool.
type Prompt struct {
	Name           string // the exposed name: prefix + the upstream's name
	Upstream       string
	UpstreamPrompt string
	Def            *mcp.Prompt // shared, do not modify
}

// Exposed returns a copy of the definition under its exposed name.
func (p Prompt) Exposed() *mcp.Prompt {
	c := *p.Def
	c.Name = p.Name
	return &c
}

// listMore lists what the upstream offers besides tools, as its
// capabilities say; each list bounded like the tools.
func (c *conn) listMore(ctx context.Context, sess *mcp.ClientSession, u *Upstream) ([]*mcp.Resource, []*mcp.ResourceTemplate, []*mcp.Prompt, error) {
	c.mu.Lock()
	o := c.offers
	c.mu.Unlock()
	var res []*mcp.Resource
	var tmpl []*mcp.ResourceTemplate
	var prompts []*mcp.Prompt
	var err error
	if o.Resources {
		if res, err = collect(ctx, u, "resources/list", sess.Resources(ctx, nil)); err != nil {
			return nil, nil, nil, err
		}
		if tmpl, err = collect(ctx, u, "resources/templates/list", sess.ResourceTemplates(ctx, nil)); err != nil {
			return nil, nil, nil, err
		}
	}
	if o.Prompts {
		if prompts, err = collect(ctx, u, "prompts/list", sess.Prompts(ctx, nil)); err != nil {
			return nil, nil, nil, err
		}
	}
	return res, tmpl, prompts, nil
}

func collect[T any](ctx context.Context, u *Upstream, method string, seq func(func(T, error) bool)) ([]T, error) {
	var out []T
	for x, err := range seq {
		if err != nil {
			return nil, fmt.Errorf("%s: %s", method, describe(ctx, u, err, u.Call))
		}
		if len(out) == maxTools {
			return nil, fmt.Errorf("%s: more than %d items", method, maxTools)
		}
		out = append(out, x)
	}
	return out, nil
}

// offered is the part of a snapshot beyond tools. The first upstream in
// file order that lists a URI or an exposed prompt name has it; a later one
// is withheld (reported by Status).
type offered struct {
	resources []Resource
	byURI     map[string]int
	templates []Template
	prompts   []Prompt
	byPrompt  map[string]int
	completes []string // upstreams offering completion/complete, in file order
}

func (s *snapshot) addOffers(cfg *Upstream, o Offers, res []*mcp.Resource, tmpl []*mcp.ResourceTemplate, prompts []*mcp.Prompt) {
	if s.byURI == nil {
		s.byURI, s.byPrompt = map[string]int{}, map[string]int{}
	}
	for _, r := range res {
		if i, ok := s.byURI[r.URI]; ok {
			s.withheld[cfg.Name] = append(s.withheld[cfg.Name], fmt.Sprintf("resource %q: already offered by upstream %q", r.URI, s.resources[i].Upstream))
			continue
		}
		s.byURI[r.URI] = len(s.resources)
		s.resources = append(s.resources, Resource{Upstream: cfg.Name, Def: r})
	}
	for _, t := range tmpl {
		ut, err := uritemplate.New(t.URITemplate)
		if err != nil {
			s.withheld[cfg.Name] = append(s.withheld[cfg.Name], fmt.Sprintf("resource template %q: %v", t.URITemplate, err))
			continue
		}
		if slices.ContainsFunc(s.templates, func(x Template) bool { return x.Def.URITemplate == t.URITemplate }) {
			s.withheld[cfg.Name] = append(s.withheld[cfg.Name], fmt.Sprintf("resource template %q: already offered", t.URITemplate))
			continue
		}
		s.templates = append(s.templates, Template{Upstream: cfg.Name, Def: t, re: ut.Regexp()})
	}
	for _, p := range prompts {
		name := cfg.Prefix + p.Name
		if i, ok := s.byPrompt[name]; ok {
			s.withheld[cfg.Name] = append(s.withheld[cfg.Name], fmt.Sprintf("prompt %q: exposed name %q already offered by upstream %q", p.Name, name, s.prompts[i].Upstream))
			continue
		}
		s.byPrompt[name] = len(s.prompts)
		s.prompts = append(s.prompts, Prompt{Name: name, Upstream: cfg.Name, UpstreamPrompt: p.Name, Def: p})
	}
	if o.Completions {
		s.completes = append(s.completes, cfg.Name)
	}
}

func sameOffers(a, b *snapshot) bool {
	return reflect.DeepEqual(a.resources, b.resources) && slices.Equal(a.completes, b.completes) &&
		reflect.DeepEqual(a.prompts, b.prompts) &&
		slices.EqualFunc(a.templates, b.templates, func(x, y Template) bool { return x.Upstream == y.Upstream && reflect.DeepEqual(x.Def, y.Def) })
}

// Offered says which features some current upstream offers: the front-end
// advertises (and serves) only those.
func (r *Registry) Offered() Offers {
	r.mu.Lock()
	defer r.mu.Unlock()
	var o Offers
	for _, c := range r.ups {
		c.mu.Lock()
		o.Resources = o.Resources || c.offers.Resources
		o.Prompts = o.Prompts || c.offers.Prompts
		o.Completions = o.Completions || c.offers.Completions
		o.Logging = o.Logging || c.offers.Logging
		o.Subscribe = o.Subscribe || c.offers.Subscribe
		c.mu.Unlock()
	}
	return o
}

// Resources returns the offered resources, in file order of their upstreams.
func (r *Registry) Resources() []Resource {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.snap.resources)
}

// Templates returns the offered resource templates.
func (r *Registry) Templates() []Template {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.snap.templates)
}

// Prompts returns the offered prompts.
func (r *Registry) Prompts() []Prompt {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.snap.prompts)
}

// ResourceOwner names the upstream that a resources/read of uri goes to:
// the one listing uri, else the first whose template matches it.
func (r *Registry) ResourceOwner(uri string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.snap.resourceOwner(uri)
}

func (s *snapshot) resourceOwner(uri string) (string, bool) {
	if i, ok := s.byURI[uri]; ok {
		return s.resources[i].Upstream, true
	}
	for _, t := range s.templates {
		if t.Def.URITemplate == uri || t.re.MatchString(uri) {
			return t.Upstream, true
		}
	}
	return "", false
}

// take finds the current conn named up and counts a call on it, under r.mu
// so a reload retiring it waits; send ends the count.
func (r *Registry) take(up string) *conn {
	for _, c := range r.ups {
		if c.name == up {
			c.calls.Add(1)
			return c
		}
	}
	return nil
}

// ReadResource forwards a resources/read of uri to the upstream that offers
// it (see ResourceOwner), at most once; with o.Upstream set, only to that
// one. Failures are *Error as for Call; a URI no upstream offers is NotSent
// with ErrNotOffered, one that another upstream offers now NotSent with
// ErrToolChanged.
func (r *Registry) ReadResource(ctx context.Context, params *mcp.ReadResourceParams, o *CallOptions) (*mcp.ReadResourceResult, error) {
	ref := fmt.Sprintf("resource %q", clip(params.URI))
	r.mu.Lock()
	up, ok := r.snap.resourceOwner(params.URI)
	c, err := r.takeDecided(ref, up, ok, o)
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var res *mcp.ReadResourceResult
	err = r.send(ctx, c, "", ref, o, params.Meta, func(ctx context.Context, s *mcp.ClientSession, meta mcp.Meta) (err error) {
		p := *params
		p.Meta = meta
		res, err = s.ReadResource(ctx, &p)
		return err
	})
	return res, err
}

// takeDecided takes the conn of up, the current owner of what ref names
// (found says there is one), provided it is the upstream the caller decided
// on (o.Upstream, when set). Under r.mu.
func (r *Registry) takeDecided(ref, up string, found bool, o *CallOptions) (*conn, error) {
	if !found {
		return nil, &Error{Ref: ref, Kind: NotSent, Reason: "no upstream offers it", cause: ErrNotOffered}
	}
	if o != nil && o.Upstream != "" && o.Upstream != up {
		return nil, &Error{Upstream: o.Upstream, Ref: ref, Kind: NotSent,
			Reason: "another upstream offers it since the request was decided; it was not sent", cause: ErrToolChanged}
	}
	c := r.take(up)
	if c == nil {
		return nil, &Error{Ref: ref, Kind: NotSent, Reason: "no upstream offers it", cause: ErrNotOffered}
	}
	return c, nil
}

// PromptByName returns the offered prompt exposed as name.
func (r *Registry) PromptByName(name string) (Prompt, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i, ok := r.snap.byPrompt[name]
	if !ok {
		return Prompt{}, false
	}
	return r.snap.prompts[i], true
}

// GetPrompt forwards a prompts/get of the prompt exposed as params.Name to
// its upstream under the upstream's name for it, with its arguments and any
// MRTR answers (inputResponses, requestState); an input_required result
// comes back as it came. With o.Upstream set, only to that upstream.
func (r *Registry) GetPrompt(ctx context.Context, params *mcp.GetPromptParams, o *CallOptions) (*mcp.GetPromptResult, error) {
	name := params.Name
	ref := fmt.Sprintf("prompt %q", clip(name))
	r.mu.Lock()
	i, ok := r.snap.byPrompt[name]
	var p Prompt
	if ok {
		p = r.snap.prompts[i]
	}
	c, err := r.takeDecided(ref, p.Upstream, ok, o)
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var res *mcp.GetPromptResult
	err = r.send(ctx, c, "", ref, o, params.Meta, func(ctx context.Context, s *mcp.ClientSession, meta mcp.Meta) (err error) {
		q := *params
		q.Meta, q.Name = meta, p.UpstreamPrompt
		res, err = s.GetPrompt(ctx, &q)
		return err
	})
	return res, err
}

// CompletionOwner names the upstream a completion/complete with ref goes
// to: the prompt's upstream (ref/prompt, by exposed name) or the resource's
// or template's (ref/resource), provided it offers completions.
func (r *Registry) CompletionOwner(ref *mcp.CompleteReference) (up, upstreamRef string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.completionOwner(ref)
}

func (r *Registry) completionOwner(ref *mcp.CompleteReference) (up, name string, ok bool) {
	if ref == nil {
		return "", "", false
	}
	switch ref.Type {
	case "ref/prompt":
		i, found := r.snap.byPrompt[ref.Name]
		if !found {
			return "", "", false
		}
		up, name = r.snap.prompts[i].Upstream, r.snap.prompts[i].UpstreamPrompt
	case "ref/resource":
		if up, ok = r.snap.resourceOwner(ref.URI); !ok {
			return "", "", false
		}
		name = ref.URI
	default:
		return "", "", false
	}
	return up, name, slices.Contains(r.snap.completes, up)
}

// Complete forwards a completion/complete to the upstream its ref belongs
// to (see CompletionOwner), the prompt named as that upstream names it;
// with o.Upstream set, only to that upstream.
func (r *Registry) Complete(ctx context.Context, params *mcp.CompleteParams, o *CallOptions) (*mcp.CompleteResult, error) {
	const ref = "completion"
	r.mu.Lock()
	up, name, ok := r.completionOwner(params.Ref)
	c, err := r.takeDecided(ref, up, ok, o)
	r.mu.Unlock()
	if err != nil {
		var e *Error
		if errors.As(err, &e) && errors.Is(err, ErrNotOffered) {
			e.Reason = "no upstream offers completions for this reference"
		}
		return nil, err
	}
	p := *params
	rf := *params.Ref
	if rf.Type == "ref/prompt" {
		rf.Name = name
	}
	p.Ref = &rf
	var res *mcp.CompleteResult
	err = r.send(ctx, c, "", ref, o, nil, func(ctx context.Context, s *mcp.ClientSession, meta mcp.Meta) (err error) {
		p.Meta = meta
		res, err = s.Complete(ctx, &p)
		return err
	})
	return res, err
}

// callerMeta is what of the caller's _meta travels upstream: its declared
// client capabilities (revision 2026-07-28 sends them with every request),
// so the upstream asks (MRTR input requests) only what the caller can
// answer, and the log level it asked for (2026-07-28's per-request level),
// so the upstream logs to it no more than it wants. Nothing else: its
// progress token and other keys are for the gateway.
func callerMeta(m mcp.Meta) mcp.Meta {
	var out mcp.Meta
	for _, k := range []string{mcp.MetaKeyClientCapabilities, mcp.MetaKeyLogLevel} {
		if v, ok := m[k]; ok {
			if out == nil {
				out = mcp.Meta{}
			}
			out[k] = v
		}
	}
	return out
}
