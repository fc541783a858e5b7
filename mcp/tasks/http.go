package tasks

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"
)

// MaxBody bounds a request body read by the wrapper.
const MaxBody = 1 << 20

// envelope is the part of a JSON-RPC request the wrapper looks at.
type envelope struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  string          `json:"method"`
	Params  struct {
		Meta          map[string]any `json:"_meta"`
		TaskID        *string        `json:"taskId"`
		Notifications *struct {
			TaskIDs []string `json:"taskIds"`
		} `json:"notifications"`
	} `json:"params"`
}

// Wrap adds to an SDK streamable handler what the SDK does not do for this
// extension: tasks/* requests must carry Mcp-Name equal to params.taskId
// (400, -32020 otherwise), and subscriptions/listen with notifications.taskIds
// is served here, streaming notifications/tasks.
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
		var env envelope
		if json.Unmarshal(body, &env) != nil {
			next.ServeHTTP(w, r) // the SDK reports malformed JSON-RPC
			return
		}
		switch env.Method {
		case MethodGet, MethodUpdate, MethodCancel:
			name := r.Header.Get(HeaderName)
			if env.Params.TaskID == nil || name != *env.Params.TaskID {
				writeError(w, http.StatusBadRequest, env.ID, CodeHeaderMismatch,
					"Mcp-Name header must equal params.taskId for "+env.Method)
				return
			}
		case MethodListen:
			if env.Params.Notifications != nil && len(env.Params.Notifications.TaskIDs) > 0 {
				s.listen(w, r, env)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

func writeError(w http.ResponseWriter, status int, id json.RawMessage, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{"code": code, "message": msg}})
}

// ListenPoll is how often a listen stream looks for task changes.
var ListenPoll = 250 * time.Millisecond

// listen serves subscriptions/listen for task notifications: an SSE stream
// that starts with notifications/subscriptions/acknowledged (echoing the task
// ids the caller owns), then carries a notifications/tasks with the full
// DetailedTask whenever a subscribed task changes, and ends with the listen
// result once every subscribed task is terminal.
func (s *Server) listen(w http.ResponseWriter, r *http.Request, env envelope) {
	if h := r.Header.Get(HeaderProtocolVersion); h == "" || h != env.Params.Meta[MetaProtocolVersion] {
		writeError(w, http.StatusBadRequest, env.ID, CodeHeaderMismatch, "Mcp-Protocol-Version must match _meta protocolVersion")
		return
	}
	if m := r.Header.Get(HeaderMethod); !strings.EqualFold(m, MethodListen) {
		writeError(w, http.StatusBadRequest, env.ID, CodeHeaderMismatch, "Mcp-Method must equal the request method")
		return
	}
	if !HasExtension(env.Params.Meta) {
		e := MissingCapability()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": env.ID, "error": e})
		return
	}
	principal := PrincipalFrom(r.Context())
	var ids []string
	last := map[string]time.Time{}
	for _, id := range env.Params.Notifications.TaskIDs {
		if _, err := s.Store.GetFor(r.Context(), id, principal); err == nil && len(ids) < 100 {
			ids = append(ids, id) // others' and unknown ids are silently not acknowledged
			last[id] = time.Time{}
		}
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		writeError(w, http.StatusInternalServerError, env.ID, CodeInternalError, "streaming unsupported")
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	subMeta := map[string]any{MetaSubscriptionID: env.ID}
	send := func(msg map[string]any) bool {
		b, _ := json.Marshal(msg)
		if _, err := w.Write([]byte("event: message\ndata: " + string(b) + "\n\n")); err != nil {
			return false
		}
		flusher.Flush()
		return true
	}
	if ids == nil {
		ids = []string{}
	}
	if !send(map[string]any{"jsonrpc": "2.0", "method": NotificationAcknowledged,
		"params": map[string]any{"notifications": map[string]any{"taskIds": ids}, "_meta": subMeta}}) {
		return
	}
	ticker := time.NewTicker(ListenPoll)
	defer ticker.Stop()
	for {
		done := 0
		for _, id := range ids {
			t, err := s.Store.Get(r.Context(), s.Store.DB, id)
			if err != nil {
				done++ // purged: nothing more will come
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
				done++
			}
		}
		if done == len(ids) {
			send(map[string]any{"jsonrpc": "2.0", "id": env.ID, "result": map[string]any{"resultType": ResultTypeComplete, "_meta": subMeta}})
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-ticker.C:
		}
	}
}
