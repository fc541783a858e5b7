package pep

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/omcp/arap/authzen"
)

// Where the gate's tools come from. A ToolSource offers tools (the demo
// tools are one, named "demo"; an upstream MCP server is another); the gate
// reads every source per call, so a tool whose definition changes upstream
// is seen changed at the next call and at the claim. A tool's identity is
// its Digest, over its whole definition: an approval is bound to it (the
// task stores it at open) and never carries over to a changed tool.

// ToolSource offers tools. Tools returns the source's current snapshot; it
// is called on every tools/list and tools/call and at every claim, so it
// must be cheap (a copy of what the source holds, not a round trip) and
// safe for concurrent use. The slice and its tools are not modified.
type ToolSource interface {
	Tools() []Tool
}

// A Connector is a source whose tools come from connections: while
// upstream is not connected it offers none of them, which does not mean
// they are gone.
type Connector interface {
	Connected(upstream string) bool
}

// StaticTools is a source whose tools never change (the demo tools).
type StaticTools []Tool

// Tools implements ToolSource.
func (s StaticTools) Tools() []Tool { return s }

// DemoUpstream names the built-in source of the demo tools.
const DemoUpstream = "demo"

// UpstreamError is a Run failure outside the tool itself: its upstream
// could not be reached, timed out, or answered outside the protocol. A
// tool that ran and reported an error returns Output.IsError instead.
// MaybeRan says whether the request may have reached the tool: after the
// execution claim a run that may have happened ends the task
// outcome-unknown and is never sent again; one that certainly did not
// ends it failed. Message is shown to the client (with the upstream's
// name): it must say what happened and hold no URL, credential or
// argument; Err, the cause, is never shown nor logged.
type UpstreamError struct {
	Upstream string
	Message  string
	MaybeRan bool
	// Transient: not sent, for a reason that may pass (no connection); the
	// same call may be tried again.
	Transient bool
	Err       error
}

func (e *UpstreamError) Error() string {
	s := fmt.Sprintf("upstream %s: %s", e.Upstream, e.Message)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *UpstreamError) Unwrap() error { return e.Err }

// shown is the error as a client may read it: the upstream, what happened,
// and whether the tool ran.
func (e *UpstreamError) shown() string {
	ran := "the tool did not run"
	if e.MaybeRan {
		ran = "the tool may have run"
	}
	return sanitize(fmt.Sprintf("upstream %s: %s; %s", e.Upstream, e.Message, ran), 300)
}

// ToolDigest is the identity of a tool's definition: the hex SHA-256 of
// the RFC 8785 (JCS) serialization of what a client and the policy see of
// it (exposed name, upstream and upstream tool name, title, description,
// input and output schema, annotations). TaskRequired and Run are this
// server's, not the definition's, and are left out.
func ToolDigest(t Tool) (string, error) {
	def := map[string]any{
		"name": t.Name, "upstream": t.Upstream, "upstream_tool": t.UpstreamTool,
		"title": t.Title, "description": t.Description,
		"inputSchema": toJSONValue(t.InputSchema), "outputSchema": toJSONValue(t.OutputSchema),
		"annotations": toJSONValue(t.Annotations),
	}
	c, err := authzen.Canonical(def)
	if err != nil {
		return "", fmt.Errorf("pep: tool %s: digest: %w", t.Name, err)
	}
	s := sha256.Sum256(c)
	return hex.EncodeToString(s[:]), nil
}

// offered is a tool as the gate found it for one call: its definition
// (UpstreamTool and Digest filled in) and its compiled input schema.
type offered struct {
	Tool
	schema *jsonschema.Schema
}

// sdkTool is the definition as tools/list shows it.
func (t *offered) sdkTool() *sdk.Tool {
	st := &sdk.Tool{Name: t.Name, Title: t.Title, Description: t.Description, InputSchema: t.InputSchema, Annotations: t.Annotations}
	if t.OutputSchema != nil {
		st.OutputSchema = t.OutputSchema
	}
	return st
}

// catalog reads the gate's sources and compiles the schemas of the tools
// it finds, once per definition (by digest).
type catalog struct {
	sources []ToolSource
	// reserved are names the server's own tools take (approval_status):
	// no source's tool of that name is offered.
	reserved []string
	mu       sync.Mutex
	schemas  map[string]*jsonschema.Schema // by digest
	bad      map[string]error              // definitions that do not compile, by digest
}

// maxSchemas bounds the compiled-schema cache: definitions that change
// upstream leave old entries behind; past the bound the cache starts over.
const maxSchemas = 4096

func newCatalog(sources []ToolSource, reserved ...string) (*catalog, error) {
	c := &catalog{sources: sources, schemas: map[string]*jsonschema.Schema{}, bad: map[string]error{}, reserved: reserved}
	// At startup every tool must compile and no exposed name may be
	// offered twice: a configuration error, refused now rather than found
	// at a call.
	seen := map[string]string{}
	for _, s := range sources {
		for _, t := range s.Tools() {
			if prev, dup := seen[t.Name]; dup {
				return nil, fmt.Errorf("pep: tool %q is offered by both %s and %s; give one of them another name", t.Name, upstreamName(prev), upstreamName(t.Upstream))
			}
			seen[t.Name] = t.Upstream
			if slices.Contains(reserved, t.Name) {
				if _, connects := s.(Connector); connects {
					continue // an upstream's tool of that name is hidden (list says why)
				}
				return nil, fmt.Errorf("pep: tool %q: the name is the server's own (approval tools)", t.Name)
			}
			if _, err := c.prepare(t); err != nil {
				if _, connects := s.(Connector); connects {
					continue // an upstream's unusable tool is not offered (list says why), as later
				}
				return nil, err
			}
		}
	}
	return c, nil
}

func upstreamName(s string) string {
	if s == "" {
		return "the built-in tools"
	}
	return "upstream " + s
}

// prepare fills in t's derived fields and compiles its schema.
func (c *catalog) prepare(t Tool) (*offered, error) {
	if t.UpstreamTool == "" {
		t.UpstreamTool = t.Name
	}
	if t.Digest == "" {
		d, err := ToolDigest(t)
		if err != nil {
			return nil, err
		}
		t.Digest = d
	}
	c.mu.Lock()
	sch, ok := c.schemas[t.Digest]
	bad := c.bad[t.Digest]
	c.mu.Unlock()
	if bad != nil {
		return nil, bad
	}
	if !ok {
		var err error
		if sch, err = compileSchema(t); err != nil {
			c.mu.Lock()
			if len(c.bad) >= maxSchemas {
				clear(c.bad)
			}
			c.bad[t.Digest] = err
			c.mu.Unlock()
			return nil, err
		}
		c.mu.Lock()
		if len(c.schemas) >= maxSchemas {
			clear(c.schemas)
		}
		c.schemas[t.Digest] = sch
		c.mu.Unlock()
	}
	return &offered{Tool: t, schema: sch}, nil
}

func compileSchema(t Tool) (*jsonschema.Schema, error) {
	if t.InputSchema == nil || t.InputSchema["type"] != "object" {
		return nil, fmt.Errorf("pep: tool %s: the input schema must be an object schema", t.Name)
	}
	c := jsonschema.NewCompiler()
	url := "urn:arap:tool:" + t.Digest
	if err := c.AddResource(url, toJSONValue(t.InputSchema)); err != nil {
		return nil, fmt.Errorf("pep: tool %s schema: %w", t.Name, err)
	}
	sch, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("pep: tool %s schema: %w", t.Name, err)
	}
	return sch, nil
}

// connected reports whether every source that connects to upstream has it
// connected now.
func (c *catalog) connected(upstream string) bool {
	for _, s := range c.sources {
		if cs, ok := s.(Connector); ok && !cs.Connected(upstream) {
			return false
		}
	}
	return true
}

// errNoTool means no source offers the tool now.
var errNoTool = errors.New("pep: no such tool")

// lookup finds the tool exposed as name in the sources' current
// snapshots; the first source that offers it wins (the built-in tools come
// first, so an upstream cannot shadow them). A tool whose schema does not
// compile is not offered.
func (c *catalog) lookup(name string) (*offered, error) {
	if slices.Contains(c.reserved, name) {
		return nil, errNoTool
	}
	for _, s := range c.sources {
		for _, t := range s.Tools() {
			if t.Name == name {
				return c.prepare(t)
			}
		}
	}
	return nil, errNoTool
}

// list is every tool offered now, by exposed name (first source wins), and
// the names skipped because their definition is unusable or taken.
func (c *catalog) list() (tools []*offered, skipped []error) {
	seen := map[string]bool{}
	for _, s := range c.sources {
		for _, t := range s.Tools() {
			if slices.Contains(c.reserved, t.Name) {
				skipped = append(skipped, fmt.Errorf("pep: tool %q of %s is hidden: the name is the server's own", t.Name, upstreamName(t.Upstream)))
				continue
			}
			if seen[t.Name] {
				skipped = append(skipped, fmt.Errorf("pep: tool %q of %s is hidden: the name is taken", t.Name, upstreamName(t.Upstream)))
				continue
			}
			o, err := c.prepare(t)
			if err != nil {
				skipped = append(skipped, err)
				continue
			}
			seen[t.Name] = true
			tools = append(tools, o)
		}
	}
	return tools, skipped
}

// resourceProperties are the evaluation request's resource properties for
// a call of t with args: the arguments, which upstream and which of its
// tools it is, and the tool's annotations (the four hints, as booleans, as
// far as the tool sets them), so one rule can cover every destructive
// tool. They are part of what binding_hash covers: an approval is bound to
// them too.
func resourceProperties(t *Tool, args map[string]any) map[string]any {
	props := map[string]any{"arguments": args}
	if t.Upstream != "" {
		props["upstream"], props["upstream_tool"] = t.Upstream, t.upstreamTool()
	}
	if a := t.Annotations; a != nil {
		hints := map[string]any{"readOnlyHint": a.ReadOnlyHint, "idempotentHint": a.IdempotentHint}
		if a.DestructiveHint != nil {
			hints["destructiveHint"] = *a.DestructiveHint
		}
		if a.OpenWorldHint != nil {
			hints["openWorldHint"] = *a.OpenWorldHint
		}
		props["annotations"] = hints
	}
	return props
}

func (t *Tool) upstreamTool() string {
	if t.UpstreamTool == "" {
		return t.Name
	}
	return t.UpstreamTool
}
