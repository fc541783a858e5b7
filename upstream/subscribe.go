package upstream

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Resource subscriptions: the front-end's listen streams subscribe to
// resources here, and the registry holds one upstream subscription per
// (upstream, URI) for all of them, made when the first watcher comes,
// dropped when the last leaves, and made again on every new session of
// that upstream (a reconnect, or a restarted upstream).

type subKey struct{ up, uri string }

// watcher is one Subscribe's callback; its pointer identifies it.
type watcher struct{ f func() }

// Subscribe has f called (it must not block) whenever upstream up sends
// notifications/resources/updated about exactly uri, until stop is called.
// Only up's updates count: another upstream cannot speak for a URI it was
// not asked about. up must be a current upstream that offers
// subscriptions; it is asked (resources/subscribe, or a subscriptions/listen
// stream on 2026-07-28) if no one watched the URI there yet. An upstream
// that is not connected now is asked when it connects; one that refuses is
// an error, and nothing is watched.
func (r *Registry) Subscribe(ctx context.Context, up, uri string, f func()) (stop func(), err error) {
	ref := fmt.Sprintf("resource %q", clip(uri))
	r.subMu.Lock()
	defer r.subMu.Unlock()
	r.mu.Lock()
	var c *conn
	for _, x := range r.ups {
		if x.name == up {
			c = x
		}
	}
	if c == nil || r.closed {
		r.mu.Unlock()
		return nil, &Error{Upstream: up, Ref: ref, Kind: NotSent, Reason: "no such upstream", cause: ErrNotOffered}
	}
	c.mu.Lock()
	sess, offers := c.session, c.offers
	c.mu.Unlock()
	if !offers.Subscribe {
		r.mu.Unlock()
		return nil, &Error{Upstream: up, Ref: ref, Kind: NotSent, Reason: "the upstream takes no resource subscriptions", cause: ErrNotOffered}
	}
	k, w := subKey{up, uri}, &watcher{f}
	if r.subs == nil {
		r.subs = map[subKey]map[*watcher]struct{}{}
	}
	first := len(r.subs[k]) == 0
	if first {
		r.subs[k] = map[*watcher]struct{}{}
	}
	r.subs[k][w] = struct{}{}
	r.mu.Unlock()
	if first && sess != nil {
		u := c.config()
		cctx, cancel := context.WithTimeout(ctx, u.Call)
		err := sess.Subscribe(cctx, &mcp.SubscribeParams{URI: uri})
		cancel()
		if err != nil {
			r.mu.Lock()
			r.drop(k, w)
			r.mu.Unlock()
			return nil, &Error{Upstream: up, Ref: ref, Kind: Rejected, Reason: "subscribe: " + describe(cctx, u, err, u.Call), cause: err}
		}
	}
	return func() { r.unsubscribe(k, w) }, nil
}

// drop removes w; it reports whether k has no watcher left. Under r.mu.
func (r *Registry) drop(k subKey, w *watcher) bool {
	delete(r.subs[k], w)
	if len(r.subs[k]) > 0 {
		return false
	}
	delete(r.subs, k)
	return true
}

func (r *Registry) unsubscribe(k subKey, w *watcher) {
	r.subMu.Lock()
	defer r.subMu.Unlock()
	r.mu.Lock()
	if _, ok := r.subs[k][w]; !ok {
		r.mu.Unlock()
		return // stopped already
	}
	last := r.drop(k, w)
	var sess *mcp.ClientSession
	var c *conn
	for _, x := range r.ups {
		if x.name == k.up {
			c = x
		}
	}
	r.mu.Unlock()
	if !last || c == nil {
		return // a retired upstream's session closes with it
	}
	c.mu.Lock()
	sess = c.session
	c.mu.Unlock()
	if sess == nil {
		return // the next session is not asked: nobody watches
	}
	u := c.config()
	ctx, cancel := context.WithTimeout(c.ctx, u.Call)
	defer cancel()
	if err := sess.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: k.uri}); err != nil {
		r.opts.Logger.Warn("upstream unsubscribe failed", "upstream", k.up, "error", describe(ctx, u, err, u.Call))
	}
}

// resubscribe asks a new session of c for every URI watched there.
func (r *Registry) resubscribe(ctx context.Context, c *conn, sess *mcp.ClientSession) {
	r.subMu.Lock()
	defer r.subMu.Unlock()
	r.mu.Lock()
	var uris []string
	for k := range r.subs {
		if k.up == c.name {
			uris = append(uris, k.uri)
		}
	}
	r.mu.Unlock()
	u := c.config()
	for _, uri := range uris {
		if err := sess.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}); err != nil {
			// Its watchers stay: a later session is asked again.
			r.opts.Logger.Warn("upstream resubscribe failed", "upstream", c.name, "error", describe(ctx, u, err, u.Call))
		}
	}
}

// updated fans an upstream's notifications/resources/updated out to the
// watchers of that upstream and URI.
func (r *Registry) updated(up, uri string) {
	r.mu.Lock()
	ws := make([]func(), 0, len(r.subs[subKey{up, uri}]))
	for w := range r.subs[subKey{up, uri}] {
		ws = append(ws, w.f)
	}
	r.mu.Unlock()
	for _, f := range ws {
		f()
	}
}
