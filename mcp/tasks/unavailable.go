package tasks

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/omcp/arap/internal/dbdown"
)

// Wire names of the unavailable error.
const (
	// UnavailablePrefix starts the message of every CodeUnavailable error.
	UnavailablePrefix = "temporarily unavailable: "
	// DataRetryAfter is the member of the error's data holding the seconds
	// to wait.
	DataRetryAfter = "retryAfterSeconds"
)

// What is unavailable, for Unavailable's message: the front-end's
// database, or the backend as the PDP (evaluation) or as the ARS
// (requests, their schemas).
const (
	WhatDatabase      = "the database is unavailable"
	WhatAuthorization = "the authorization service is unavailable"
	WhatApproval      = "the approval service is unavailable"
)

// Unavailable is the JSON-RPC error of a request that failed because what
// (WhatDatabase, WhatAuthorization, WhatApproval) is unavailable: CodeUnavailable, a message
// saying when to retry, and the seconds in data.
func Unavailable(what string) *jsonrpc.Error {
	data, _ := json.Marshal(map[string]any{DataRetryAfter: int(dbdown.RetryAfter.Seconds())})
	return &jsonrpc.Error{Code: CodeUnavailable, Message: UnavailablePrefix + what + "; retry after " + dbdown.RetryAfterHeader + " s", Data: data}
}

// WriteUnavailable answers an MCP HTTP request that failed before the SDK
// dispatched it (authentication, rate limiting, a listen stream's
// opening) because what is
// unavailable: HTTP 503 with Retry-After and the Unavailable error as a
// JSON-RPC response to the request's id (null when it cannot be read).
func WriteUnavailable(w http.ResponseWriter, r *http.Request, what string) {
	var id json.RawMessage
	if r.Body != nil {
		body, _ := io.ReadAll(io.LimitReader(r.Body, MaxBody))
		r.Body = io.NopCloser(bytes.NewReader(body))
		var m struct {
			ID json.RawMessage `json:"id"`
		}
		if json.Unmarshal(body, &m) == nil {
			id = m.ID
		}
	}
	writeUnavailable(w, id, what)
}

func writeUnavailable(w http.ResponseWriter, id json.RawMessage, what string) {
	e := Unavailable(what)
	w.Header().Set("Retry-After", dbdown.RetryAfterHeader)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusServiceUnavailable)
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": id,
		"error": map[string]any{"code": e.Code, "message": e.Message, "data": e.Data}})
}
