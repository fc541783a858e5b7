package tasks

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// MaxBody bounds a request body read by the wrapper.
const MaxBody = 1 << 20

// Wrap adds to an SDK streamable handler what the SDK does not do for this
// extension: tasks/* requests must carry Mcp-Name equal to params.taskId
// (400, -32020 otherwise), and subscriptions/listen with notifications.taskIds
// is served here, streaming notifications/tasks.
//
// The check must read the body exactly as the SDK does, or a body could pass
// it with one taskId and have the SDK act on another. The SDK (v1.8.0,
// internal/json) decodes with segmentio/encoding/json, matching member names
// case-sensitively, taking the last of duplicate members and ignoring
// anything after the first JSON value. So the wrapper reads members by exact
// name (maps, not encoding/json's case-insensitive struct fields), and
// refuses what the two could read differently: a body that is not exactly
// one JSON value, an object with a repeated member name, case variants of
// the members it reads, and tasks methods inside a batch.
func (s *Server) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
		if err != nil {
			http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		msgs, batch, perr := parse(body)
		if perr != nil {
			writeError(w, http.StatusBadRequest, perr.id, perr.code, perr.msg)
			return
		}
		if batch {
			for _, m := range msgs {
				if m.method == MethodGet || m.method == MethodUpdate || m.method == MethodCancel || m.method == MethodListen {
					writeError(w, http.StatusBadRequest, nil, CodeInvalidRequest, m.method+" cannot be sent in a batch")
					return
				}
			}
			next.ServeHTTP(w, r)
			return
		}
		if len(msgs) == 0 {
			next.ServeHTTP(w, r) // not an object: the SDK reports it
			return
		}
		m := msgs[0]
		switch m.method {
		case MethodGet, MethodUpdate, MethodCancel:
			name := r.Header.Get(HeaderName)
			id, ok := m.str(m.params["taskId"])
			if !ok || name != id {
				writeError(w, http.StatusBadRequest, m.id, CodeHeaderMismatch,
					"Mcp-Name header must equal params.taskId for "+m.method)
				return
			}
		case MethodListen:
			ids, want, err := s.opts(m)
			if err != nil {
				writeError(w, http.StatusBadRequest, m.id, CodeInvalidParams, err.Error())
				return
			}
			if len(ids) > 0 || want.Any() {
				s.listen(w, r, m, ids, want)
				return
			}
			// Nothing this server serves: the SDK answers.
		}
		next.ServeHTTP(w, r)
	})
}

// message is what the wrapper reads of a JSON-RPC request: members by
// exact name.
type message struct {
	id     json.RawMessage
	method string
	params map[string]json.RawMessage
}

func (message) str(raw json.RawMessage) (string, bool) {
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// meta is params._meta (nil when absent or not an object).
func (m message) meta() map[string]any {
	var meta map[string]any
	_ = json.Unmarshal(m.params["_meta"], &meta)
	return meta
}

// objectMembers decodes a JSON object's members by exact name; nil if raw
// is not an object.
func objectMembers(raw json.RawMessage) map[string]json.RawMessage {
	var out map[string]json.RawMessage
	if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &out) != nil {
		return nil
	}
	return out
}

// parseError is a body the wrapper refuses.
type parseError struct {
	code int
	msg  string
	id   json.RawMessage
}

// readNames are the members the wrapper reads, by the path of the object
// that holds them ("" is the message itself). A case variant of one of
// them is refused: encoding/json would match it, the SDK would not.
var readNames = map[string][]string{
	"":                     {"jsonrpc", "id", "method", "params"},
	"params":               {"_meta", "taskId", "notifications"},
	"params.notifications": {OptTaskIDs, OptToolsListChanged, OptPromptsListChanged, OptResourcesListChanged, OptResourceSubscriptions},
}

// parse checks body (see Wrap) and returns its messages: one for a single
// request object, each element that is an object for a batch, none for
// any other JSON value.
func parse(body []byte) ([]message, bool, *parseError) {
	if err := inspect(body); err != nil {
		return nil, false, err
	}
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	var raws []json.RawMessage
	batch := len(trimmed) > 0 && trimmed[0] == '['
	if batch {
		_ = json.Unmarshal(body, &raws)
	} else {
		raws = []json.RawMessage{body}
	}
	var msgs []message
	for _, raw := range raws {
		top := objectMembers(raw)
		if top == nil {
			continue
		}
		m := message{id: top["id"], params: objectMembers(top["params"])}
		m.method, _ = m.str(top["method"])
		msgs = append(msgs, m)
	}
	return msgs, batch, nil
}

// inspect walks body token by token: it must be exactly one JSON value, no
// object in it may repeat a member name, and the objects the wrapper reads
// may hold no case variant of the names it reads.
func inspect(body []byte) *parseError {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	type frame struct {
		object   bool
		path     string // "-" once off the read path
		keys     map[string]struct{}
		key      string // the member whose value comes next
		wantsKey bool
	}
	var stack []*frame
	child := func(parent *frame) string {
		switch {
		case parent == nil:
			return "" // the message, or a batch of them
		case !parent.object && len(stack) == 1:
			return "" // an element of a batch is a message
		case !parent.object:
			return "-"
		case parent.path == "":
			return parent.key
		case parent.path == "params":
			return "params." + parent.key
		}
		return "-"
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			if len(stack) == 0 {
				return &parseError{code: CodeParseError, msg: "empty request body"}
			}
			return &parseError{code: CodeParseError, msg: "malformed JSON"}
		}
		if err != nil {
			return &parseError{code: CodeParseError, msg: "malformed JSON: " + err.Error()}
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.object && top.wantsKey {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
			} else {
				key := tok.(string)
				if _, dup := top.keys[key]; dup {
					return &parseError{code: CodeInvalidRequest, msg: "duplicate member " + quote(key) + " in a JSON object"}
				}
				for _, name := range readNames[top.path] {
					if key != name && strings.EqualFold(key, name) {
						return &parseError{code: CodeInvalidRequest, msg: "member " + quote(key) + " is a case variant of " + strconv.Quote(name)}
					}
				}
				top.keys[key] = struct{}{}
				top.key, top.wantsKey = key, false
				continue
			}
		} else if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{', '[':
				f := &frame{object: d == '{', path: child(top), wantsKey: d == '{'}
				if f.object {
					f.keys = map[string]struct{}{}
				}
				stack = append(stack, f)
				continue
			case ']':
				stack = stack[:len(stack)-1]
			}
		} else if top != nil && top.object {
			top.wantsKey = true // a scalar value ends the member
			continue
		}
		// A value (object, array or scalar) has just ended.
		if len(stack) > 0 {
			if p := stack[len(stack)-1]; p.object {
				p.wantsKey = true
			}
			continue
		}
		if _, err := dec.Token(); err != io.EOF {
			return &parseError{code: CodeParseError, msg: "malformed JSON: data after the request"}
		}
		return nil
	}
}

// quote quotes a member name from a request for an error message, bounded.
func quote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return strconv.Quote(s)
}

func writeError(w http.ResponseWriter, status int, id json.RawMessage, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{"code": code, "message": msg}})
}

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

func (s *Server) log() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}
