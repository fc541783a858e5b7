package tasks

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/omcp/arap/internal/dbdown"
)

// opts reads params.notifications of a subscriptions/listen: the task ids,
// and, when the server has Changes, the other opt-ins; an error for a
// member of the wrong type or too many URIs.
func (s *Server) opts(m message) ([]string, Wants, error) {
	n := objectMembers(m.params["notifications"])
	var ids []string
	if raw, ok := n[OptTaskIDs]; ok && json.Unmarshal(raw, &ids) != nil {
		return nil, Wants{}, errors.New("notifications.taskIds must be an array of task ids")
	}
	var want Wants
	if s.Changes == nil {
		return ids, want, nil // the SDK serves the others, as before
	}
	for name, v := range map[string]*bool{OptToolsListChanged: &want.ToolsListChanged,
		OptPromptsListChanged: &want.PromptsListChanged, OptResourcesListChanged: &want.ResourcesListChanged} {
		if raw, ok := n[name]; ok && json.Unmarshal(raw, v) != nil {
			return nil, Wants{}, fmt.Errorf("notifications.%s must be a boolean", name)
		}
	}
	if raw, ok := n[OptResourceSubscriptions]; ok {
		var uris []string
		if json.Unmarshal(raw, &uris) != nil {
			return nil, Wants{}, errors.New("notifications.resourceSubscriptions must be an array of resource URIs")
		}
		seen := map[string]bool{}
		for _, u := range uris {
			if u == "" {
				return nil, Wants{}, errors.New("notifications.resourceSubscriptions: a URI is empty")
			}
			if !seen[u] {
				seen[u] = true
				want.ResourceSubscriptions = append(want.ResourceSubscriptions, u)
			}
		}
		if len(want.ResourceSubscriptions) > MaxListenURIs {
			return nil, Wants{}, fmt.Errorf("notifications.resourceSubscriptions: at most %d URIs on one stream", MaxListenURIs)
		}
	}
	return ids, want, nil
}

// listenWriteTimeout bounds one write on a listen stream: a client that
// stops reading is dropped instead of holding the stream open.
const listenWriteTimeout = 10 * time.Second

// maxListenTasks bounds the tasks one stream follows.
const maxListenTasks = 100

// listen serves subscriptions/listen: an SSE stream that starts with
// notifications/subscriptions/acknowledged, echoing what it accepted (the
// task ids the caller owns; the list changes and resource URIs Changes
// accepted), then carries a notifications/tasks with the full DetailedTask
// whenever a subscribed task changes, and the list changes and
// notifications/resources/updated it accepted as Changes reports them. It
// ends with the listen result when it has nothing left to carry (every
// subscribed task terminal, and no other opt-in accepted), when the stream
// reaches its maximum lifetime, or when the server stops (the result tells
// the client the subscription ended; it may listen again). Task changes
// arrive from the Notifier; the stream re-reads its tasks every Resync in
// case a notification was lost, and sends an SSE comment then as a
// keep-alive. Only a request for task ids needs the tasks extension.
func (s *Server) listen(w http.ResponseWriter, r *http.Request, m message, requested []string, want Wants) {
	meta := m.meta()
	if h := r.Header.Get(HeaderProtocolVersion); h == "" || h != meta[MetaProtocolVersion] {
		writeError(w, http.StatusBadRequest, m.id, CodeHeaderMismatch, "Mcp-Protocol-Version must match _meta protocolVersion")
		return
	}
	if r.Header.Get(HeaderMethod) != MethodListen { // header values are case-sensitive
		writeError(w, http.StatusBadRequest, m.id, CodeHeaderMismatch, "Mcp-Method must equal the request method")
		return
	}
	if len(requested) > 0 && !HasExtension(meta) {
		e := MissingCapability()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": m.id, "error": e})
		return
	}
	n := s.Notifier
	if n == nil {
		writeError(w, http.StatusInternalServerError, m.id, CodeInternalError, "subscriptions/listen is not available on this server")
		return
	}
	ctx := r.Context()
	var ids []string
	if len(requested) > 0 {
		// Others' and unknown ids are silently not acknowledged.
		var err error
		if ids, err = s.Store.Owned(ctx, PrincipalFrom(ctx), requested, maxListenTasks); err != nil {
			if dbdown.Is(err) {
				s.log().Warn("listen: task lookup: database unavailable", "error", err)
				writeUnavailable(w, m.id, WhatDatabase)
				return
			}
			s.log().Error("listen: task lookup failed", "error", err)
			writeError(w, http.StatusInternalServerError, m.id, CodeInternalError, "internal error")
			return
		}
	}
	// Subscribed before the first read, so no change falls between them;
	// every stream counts toward the caller's cap, whatever it carries.
	sub, err := n.subscribe(PrincipalFrom(ctx), ids)
	switch {
	case errors.Is(err, errTooManyStreams):
		writeError(w, http.StatusTooManyRequests, m.id, CodeTooManyStreams,
			fmt.Sprintf("too many open subscriptions/listen streams for this caller (at most %d); close one first", n.cfg.MaxStreams))
		return
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, m.id, CodeInternalError, "the server is shutting down")
		return
	}
	defer sub.close()
	var accepted Wants
	var feed Feed
	var changed <-chan struct{} // nil (never ready) without a feed
	if want.Any() {
		// Watched before the acknowledgement, so no change falls between.
		if accepted, feed, err = s.Changes.Watch(ctx, want); err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log().Error("listen: subscriptions could not be decided", "error", err)
			writeError(w, http.StatusInternalServerError, m.id, CodeInternalError, "the subscriptions could not be decided; try again")
			return
		}
		if feed != nil {
			defer feed.Close()
			changed = feed.Wake()
		}
	}

	rc := http.NewResponseController(w)
	// The server's write timeout is for a response, not for a stream that
	// may last its lifetime: each write has its own deadline instead.
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	subMeta := map[string]any{MetaSubscriptionID: m.id}
	write := func(event string) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(listenWriteTimeout))
		if _, err := io.WriteString(w, event); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	send := func(msg map[string]any) bool {
		b, _ := json.Marshal(msg)
		return write("event: message\ndata: " + string(b) + "\n\n")
	}
	result := func() {
		send(map[string]any{"jsonrpc": "2.0", "id": m.id, "result": map[string]any{"resultType": ResultTypeComplete, "_meta": subMeta}})
	}
	ack := map[string]any{}
	raw, _ := json.Marshal(accepted)
	_ = json.Unmarshal(raw, &ack)
	if len(requested) > 0 {
		ack[OptTaskIDs] = ids
	}
	if !send(map[string]any{"jsonrpc": "2.0", "method": NotificationAcknowledged,
		"params": map[string]any{"notifications": ack, "_meta": subMeta}}) {
		return
	}

	lifetime := time.NewTimer(n.cfg.MaxLifetime)
	defer lifetime.Stop()
	resync := time.NewTicker(n.cfg.Resync)
	defer resync.Stop()
	last := map[string]time.Time{}
	open := map[string]bool{} // subscribed tasks not yet terminal
	for _, id := range ids {
		open[id] = true
	}
	check := ids
	for {
		if len(check) > 0 {
			found, err := s.Store.GetMany(ctx, check)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				s.log().Warn("listen: task read failed; retried at the next resync", "error", err)
				found = nil
			}
			for _, id := range check {
				t, ok := found[id]
				switch {
				case !open[id] || err != nil:
					continue
				case !ok:
					delete(open, id) // purged: nothing more will come
					continue
				}
				if t.UpdatedAt.After(last[id]) {
					last[id] = t.UpdatedAt
					params := map[string]any{}
					raw, _ := json.Marshal(t.Detailed())
					_ = json.Unmarshal(raw, &params)
					params["_meta"] = merge(t.Meta, subMeta)
					if !send(map[string]any{"jsonrpc": "2.0", "method": NotificationTasks, "params": params}) {
						return
					}
				}
				if t.Status.Terminal() {
					delete(open, id)
				}
			}
			check = nil
		}
		if len(open) == 0 && feed == nil {
			result()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-sub.wakeup:
			check = sub.take()
		case <-changed:
			for _, c := range feed.Take() {
				params := map[string]any{"_meta": subMeta}
				if c.Method == NotificationResourceUpdated {
					params["uri"] = c.URI
				}
				if !send(map[string]any{"jsonrpc": "2.0", "method": c.Method, "params": params}) {
					return
				}
			}
		case <-resync.C:
			if !write(":\n\n") {
				return
			}
			check = make([]string, 0, len(open))
			for id := range open {
				check = append(check, id)
			}
		case <-lifetime.C:
			result()
			return
		case <-n.ended:
			result()
			return
		}
	}
}
