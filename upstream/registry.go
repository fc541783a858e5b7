package upstream

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gowebpki/jcs"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// maxTools bounds what one upstream may list, so a broken or hostile
// upstream cannot grow the gateway's memory without end.
const maxTools = 10000

// Tool is one tool the gateway offers, as the registry last listed it.
type Tool struct {
	Name         string    // the exposed name: prefix + the upstream's name
	Upstream     string    // the upstream's name in the file
	UpstreamTool string    // the tool's name at the upstream
	TaskRequired bool      // matched by tools.task_required
	Def          *mcp.Tool // as the upstream listed it (schemas, annotations, _meta); shared, do not modify
	Digest       string    // hex SHA-256 of the RFC 8785 form of Def: changes whenever the definition does
}

// Exposed returns a copy of the definition under its exposed name, for
// tools/list.
func (t Tool) Exposed() *mcp.Tool {
	c := *t.Def
	c.Name = t.Name
	return &c
}

// Status is one upstream's state, for /readyz and operators.
type Status struct {
	Name      string
	Connected bool
	Protocol  string   // the negotiated MCP protocol version
	Err       error    // why it is not connected (no URL or credential in it)
	Tools     int      // tools exposed from it
	Withheld  []string // tools it lists that are not exposed, each with why
}

// Options configure a Registry; the zero value works.
type Options struct {
	Logger *slog.Logger
	// Client is how the gateway introduces itself to upstreams.
	Client *mcp.Implementation
	// Reserved are exposed names that belong to tools outside the registry
	// (the built-in ones); an upstream tool exposed under one is a collision.
	Reserved []string
	// MinBackoff and MaxBackoff bound the delay between reconnect attempts
	// (defaults 200ms and 30s); the delay doubles after each failure.
	MinBackoff, MaxBackoff time.Duration
}

// Registry holds a session to every configured upstream and the merged set
// of their tools. It reconnects lost upstreams with backoff and follows
// their tool lists; it never retries a tools/call.
type Registry struct {
	opts     Options
	reloadMu sync.Mutex // one Reload at a time

	mu     sync.Mutex
	ups    []*conn        // the current set, in file order
	snap   *snapshot      // the tools of ups; replaced, never modified
	live   map[*conn]bool // current and retiring conns, for Close
	closed bool
	seq    atomic.Int64 // progress tokens
	prog   sync.Map     // progress token -> func(*mcp.ProgressNotificationParams)

	watchers   map[*func()]struct{}          // OnChange's
	announcers map[*func(Announced)]struct{} // OnAnnounce's
	subs       map[subKey]map[*watcher]struct{}
	// subMu serializes the subscribe and unsubscribe exchanges with
	// upstreams (taken before mu, never held by a fan-out).
	subMu sync.Mutex
}

type snapshot struct {
	tools    []Tool
	byName   map[string]int
	withheld map[string][]string
	offered
}

// New returns an empty registry; Reload gives it its upstreams.
func New(opts Options) *Registry {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Client == nil {
		opts.Client = &mcp.Implementation{Name: "arapd-gateway", Version: "1"}
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 200 * time.Millisecond
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(30*time.Second, opts.MinBackoff)
	}
	return &Registry{opts: opts, snap: &snapshot{byName: map[string]int{}}, live: map[*conn]bool{}}
}

// Reload makes cfg the registry's set of upstreams. Upstreams whose
// transport and credentials are unchanged keep their sessions (and their
// in-flight calls); new ones are connected, each given one attempt of its
// connect timeout; removed ones are closed once their in-flight calls end.
// If two tools would be exposed under one name (across upstreams or with a
// reserved name), nothing changes and the error names both. An upstream that
// cannot be reached does not fail the reload: it is reported by Status and
// Ready and retried with backoff.
func (r *Registry) Reload(ctx context.Context, cfg *Config) error {
	r.reloadMu.Lock()
	defer r.reloadMu.Unlock()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return errors.New("upstreams: registry closed")
	}
	old := slices.Clone(r.ups)
	r.mu.Unlock()

	type pair struct {
		c   *conn
		cfg Upstream
	}
	var next []pair
	var fresh []*conn
	for _, u := range cfg.Upstreams {
		i := slices.IndexFunc(old, func(c *conn) bool { return c.name == u.Name })
		if i >= 0 && old[i].config().same(&u) {
			next = append(next, pair{old[i], u})
			continue
		}
		c := r.newConn(u)
		fresh = append(fresh, c)
		next = append(next, pair{c, u})
	}
	for _, c := range fresh {
		select {
		case <-c.firstTry:
		case <-ctx.Done():
		}
	}
	abandon := func() {
		for _, c := range fresh {
			c.cancel()
			<-c.done
		}
	}
	if err := ctx.Err(); err != nil {
		abandon()
		return fmt.Errorf("upstreams: reload: %w", err)
	}

	r.mu.Lock()
	views := make([]view, len(next))
	for i, p := range next {
		views[i] = view{p.c, &next[i].cfg}
	}
	snap, err := build(views, r.opts.Reserved, nil, true)
	if err != nil {
		r.mu.Unlock()
		abandon()
		return fmt.Errorf("upstreams %s: refused, the previous set stays: %w", cfg.Source, err)
	}
	var retire []*conn
	for _, c := range old {
		if !slices.ContainsFunc(next, func(p pair) bool { return p.c == c }) {
			retire = append(retire, c)
		}
	}
	for _, p := range next {
		p.c.setConfig(p.cfg)
		r.live[p.c] = true
	}
	r.ups = make([]*conn, len(next))
	for i, p := range next {
		r.ups[i] = p.c
	}
	changed := !sameTools(r.snap, snap)
	r.snap = snap
	r.mu.Unlock()

	for _, c := range retire {
		go func() {
			// No new calls: c left r.ups under r.mu. (The SDK's session
			// Close waits for outstanding calls too; this does not rely on it.)
			c.calls.Wait()
			c.cancel()
		}()
	}
	if changed {
		r.changed()
	}
	return nil
}

// OnChange has f called, outside any lock, after the offered set changed
// (a tool, resource, template or prompt added, gone or redefined), until
// stop is called: the front-end offers the new set and tells its clients.
func (r *Registry) OnChange(f func()) (stop func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.watchers == nil {
		r.watchers = map[*func()]struct{}{}
	}
	r.watchers[&f] = struct{}{}
	return func() {
		r.mu.Lock()
		delete(r.watchers, &f)
		r.mu.Unlock()
	}
}

// Announced are the lists an upstream's notifications/*/list_changed name.
type Announced uint32

const (
	AnnouncedTools Announced = 1 << iota
	AnnouncedPrompts
	AnnouncedResources
)

// OnAnnounce has f called, outside any lock, when an upstream said that
// lists changed (kinds), after the re-list that followed: whether or not
// what the gateway offers changed (OnChange), its clients may re-list, as
// the upstream's own clients would be told to. Until stop is called.
func (r *Registry) OnAnnounce(f func(kinds Announced)) (stop func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.announcers == nil {
		r.announcers = map[*func(Announced)]struct{}{}
	}
	r.announcers[&f] = struct{}{}
	return func() {
		r.mu.Lock()
		delete(r.announcers, &f)
		r.mu.Unlock()
	}
}

func (r *Registry) announced(kinds Announced) {
	r.mu.Lock()
	fs := make([]func(Announced), 0, len(r.announcers))
	for f := range r.announcers {
		fs = append(fs, *f)
	}
	r.mu.Unlock()
	for _, f := range fs {
		f(kinds)
	}
}

func (r *Registry) changed() {
	r.mu.Lock()
	fs := make([]func(), 0, len(r.watchers))
	for f := range r.watchers {
		fs = append(fs, *f)
	}
	r.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

// Tools returns the exposed tools, sorted by name.
func (r *Registry) Tools() []Tool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.snap.tools)
}

// Status reports every current upstream, in file order.
func (r *Registry) Status() []Status {
	r.mu.Lock()
	ups, snap := slices.Clone(r.ups), r.snap
	r.mu.Unlock()
	out := make([]Status, 0, len(ups))
	for _, c := range ups {
		c.mu.Lock()
		s := Status{Name: c.name, Connected: c.session != nil, Protocol: c.protocol, Err: c.err}
		c.mu.Unlock()
		if !s.Connected && s.Err == nil {
			s.Err = errors.New("connecting")
		}
		for _, t := range snap.tools {
			if t.Upstream == c.name {
				s.Tools++
			}
		}
		s.Withheld = snap.withheld[c.name]
		out = append(out, s)
	}
	return out
}

// Ready maps each upstream's name to nil when it is connected, else to why
// not.
func (r *Registry) Ready() map[string]error {
	m := map[string]error{}
	for _, s := range r.Status() {
		m[s.Name] = s.Err
	}
	return m
}

// Settled reports whether the registry's view of upstream name is
// complete: false while name is configured but not connected, and after
// Close; true for a connected upstream and for a name the file does not
// have (whose tools are gone).
func (r *Registry) Settled(name string) bool {
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return false
	}
	err, configured := r.Ready()[name]
	return !configured || err == nil
}

// Close stops reconnecting, waits for in-flight calls until ctx is done,
// then closes every session (stopping stdio children). The SDK's session
// Close lets outstanding calls finish, so Close can outlast ctx by up to
// the longest call timeout.
func (r *Registry) Close(ctx context.Context) error {
	r.reloadMu.Lock()
	defer r.reloadMu.Unlock()
	r.mu.Lock()
	r.closed = true
	var all []*conn
	for c := range r.live {
		all = append(all, c)
	}
	r.ups = nil
	r.snap = &snapshot{byName: map[string]int{}}
	r.mu.Unlock()
	idle := make(chan struct{})
	go func() {
		for _, c := range all {
			c.calls.Wait()
		}
		close(idle)
	}()
	select {
	case <-idle:
	case <-ctx.Done():
	}
	for _, c := range all {
		c.cancel()
	}
	for _, c := range all {
		<-c.done
	}
	return ctx.Err()
}

// rebuild recomputes the tools after an upstream's list changed. A name
// that now collides stays with the tool that had it; the newcomer is
// withheld and reported by Status.
func (r *Registry) rebuild() {
	r.mu.Lock()
	views := make([]view, 0, len(r.ups))
	for _, c := range r.ups {
		views = append(views, view{c, nil})
	}
	snap, _ := build(views, r.opts.Reserved, r.snap, false)
	changed := !sameTools(r.snap, snap)
	if !r.closed {
		r.snap = snap
	}
	r.mu.Unlock()
	if changed {
		r.changed()
	}
}

// view is a conn seen through a configuration: its own, or the candidate
// one of a reload.
type view struct {
	c   *conn
	cfg *Upstream
}

func build(views []view, reserved []string, prev *snapshot, strict bool) (*snapshot, error) {
	s := &snapshot{byName: map[string]int{}, withheld: map[string][]string{}}
	type cand struct {
		t    Tool
		rank int // lower wins a collision
	}
	owner := map[string]cand{}
	var errs []error
	for vi, v := range views {
		cfg := v.cfg
		v.c.mu.Lock()
		if cfg == nil {
			own := v.c.cfg
			cfg = &own
		}
		tools := v.c.tools
		digests := v.c.digests
		s.addOffers(cfg, v.c.offers, v.c.resources, v.c.templates, v.c.prompts)
		v.c.mu.Unlock()
		for i, def := range tools {
			name, ok := cfg.exposes(def.Name)
			if !ok {
				continue
			}
			if !validToolName(name) {
				s.withheld[cfg.Name] = append(s.withheld[cfg.Name], fmt.Sprintf("%s: exposed name %q is not a valid MCP tool name", def.Name, name))
				continue
			}
			if slices.Contains(reserved, name) {
				msg := fmt.Sprintf("tool %q of upstream %q would be exposed as %q, a built-in tool's name", def.Name, cfg.Name, name)
				errs = append(errs, errors.New(msg))
				s.withheld[cfg.Name] = append(s.withheld[cfg.Name], msg)
				continue
			}
			t := Tool{Name: name, Upstream: cfg.Name, UpstreamTool: def.Name, TaskRequired: cfg.taskRequired(def.Name), Def: def, Digest: digests[i]}
			rank := vi
			if prev != nil {
				if j, ok := prev.byName[name]; ok && prev.tools[j].Upstream == cfg.Name && prev.tools[j].UpstreamTool == def.Name {
					rank = -1 // the name stays with the tool that had it
				}
			}
			if o, taken := owner[name]; taken {
				loser, winner := t, o.t
				if rank < o.rank {
					loser, winner = o.t, t
					owner[name] = cand{t, rank}
				}
				msg := fmt.Sprintf("tool name %q is exposed by upstream %q (tool %q) and upstream %q (tool %q)", name, winner.Upstream, winner.UpstreamTool, loser.Upstream, loser.UpstreamTool)
				errs = append(errs, errors.New(msg))
				s.withheld[loser.Upstream] = append(s.withheld[loser.Upstream], loser.UpstreamTool+": "+msg)
				continue
			}
			owner[name] = cand{t, rank}
		}
	}
	if strict && len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	for _, o := range owner {
		s.tools = append(s.tools, o.t)
	}
	sort.Slice(s.tools, func(i, j int) bool { return s.tools[i].Name < s.tools[j].Name })
	for i, t := range s.tools {
		s.byName[t.Name] = i
	}
	return s, nil
}

func sameTools(a, b *snapshot) bool {
	return sameOffers(a, b) && slices.EqualFunc(a.tools, b.tools, func(x, y Tool) bool {
		return x.Name == y.Name && x.Digest == y.Digest && x.TaskRequired == y.TaskRequired && x.Upstream == y.Upstream
	})
}

// digest is the hex SHA-256 of the RFC 8785 canonical JSON of a definition.
func digest(t *mcp.Tool) (string, error) {
	raw, err := json.Marshal(t)
	if err != nil {
		return "", err
	}
	canon, err := jcs.Transform(raw)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:]), nil
}

func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2+1)
}
