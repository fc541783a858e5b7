package tasks

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json/jsontext"
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
		if v := r.Header.Get(HeaderProtocolVersion); v != "" && v < ProtocolVersion {
			// A revision before the extension (2025-11-25's tasks, legacy.go):
			// no Mcp-Name, and a tools/call may ask for a task.
			_, task := m.params["task"]
			r = r.WithContext(withLegacy(r.Context(), m.method == "tools/call" && task))
			next.ServeHTTP(w, r)
			return
		}
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
// may hold no case variant of the names it reads. jsontext reads the
// tokens (encoding/json's Token allocated for each); duplicate names and
// invalid UTF-8 are left to the checks below, which read names as
// encoding/json does.
func inspect(body []byte) *parseError {
	dec := jsontext.NewDecoder(bytes.NewReader(body), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	var stack []frame
	for {
		tok, err := dec.ReadToken()
		if err == io.EOF {
			if len(stack) == 0 {
				return &parseError{code: CodeParseError, msg: "empty request body"}
			}
			return &parseError{code: CodeParseError, msg: "malformed JSON"}
		}
		if err != nil {
			return &parseError{code: CodeParseError, msg: "malformed JSON: " + err.Error()}
		}
		// In an object, every other token is a member name.
		if n := len(stack); n > 0 && stack[n-1].object && tok.Kind() == '"' && isName(dec) {
			top := &stack[n-1]
			key := tok.String()
			if top.has(key) {
				return &parseError{code: CodeInvalidRequest, msg: "duplicate member " + quote(key) + " in a JSON object"}
			}
			for _, name := range readNames[top.path] {
				if key != name && strings.EqualFold(key, name) {
					return &parseError{code: CodeInvalidRequest, msg: "member " + quote(key) + " is a case variant of " + strconv.Quote(name)}
				}
			}
			top.add(key)
			continue
		}
		switch tok.Kind() {
		case '{', '[':
			path := "-"
			switch n := len(stack); {
			case n == 0:
				path = "" // the message, or a batch of them
			case !stack[n-1].object && n == 1:
				path = "" // an element of a batch is a message
			case stack[n-1].object && stack[n-1].path == "":
				path = stack[n-1].last
			case stack[n-1].object && stack[n-1].path == "params":
				path = "params." + stack[n-1].last
			}
			stack = append(stack, frame{object: tok.Kind() == '{', path: path})
			continue
		case '}', ']':
			stack = stack[:len(stack)-1]
		}
		if len(stack) > 0 {
			continue
		}
		// The top-level value has ended: nothing may follow it.
		if _, err := dec.ReadToken(); err != io.EOF {
			return &parseError{code: CodeParseError, msg: "malformed JSON: data after the request"}
		}
		return nil
	}
}

// frame is an object or array inspect is in.
type frame struct {
	object bool
	path   string              // "-" once off the read path
	last   string              // the member whose value comes next
	few    []string            // the object's member names so far, while few
	many   map[string]struct{} // then all of them: scanning a list is quadratic
}

// has reports whether the object already has a member named key.
func (f *frame) has(key string) bool {
	if f.many != nil {
		_, ok := f.many[key]
		return ok
	}
	return slices.Contains(f.few, key)
}

// add records member key, which comes next.
func (f *frame) add(key string) {
	f.last = key
	switch {
	case f.many != nil:
		f.many[key] = struct{}{}
	case len(f.few) < 16:
		f.few = append(f.few, key)
	default:
		f.many = make(map[string]struct{}, 2*len(f.few))
		for _, k := range f.few {
			f.many[k] = struct{}{}
		}
		f.many[key] = struct{}{}
		f.few = nil
	}
}

// isName reports whether the string token just read is a member name: in
// an object, names are the odd tokens.
func isName(dec *jsontext.Decoder) bool {
	_, n := dec.StackIndex(dec.StackDepth())
	return n%2 == 1
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

func (s *Server) log() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}
