package pep

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/omcp/arap/authzen"
)

// What a gated call is bound to: its tool, its exact arguments and its
// caller. The binding is fixed when the task opens, sealed at rest (AAD =
// task id), and what every later step (the AuthZEN requests, the
// submission, the run) is built from.

// binding is the immutable call binding of an approval task.
type binding struct {
	Tool      string         `json:"tool"`
	Args      map[string]any `json:"args"`
	Principal Principal      `json:"principal"`
}

// binding opens a's sealed call binding and checks it against its digest.
func (g *Gate) binding(a *approvalTask) (binding, error) {
	var b binding
	plain, err := g.box.Open(a.ArgsSealed, a.TaskID)
	if err != nil {
		return b, fmt.Errorf("pep: task %s: call binding does not open: %w", a.TaskID, err)
	}
	if err := json.Unmarshal(plain, &b); err != nil {
		return b, err
	}
	d, err := digest(b.Tool, b.Args)
	if err != nil {
		return b, err
	}
	if d != a.ArgsDigest || b.Tool != a.Tool || b.Principal.Key() != a.Principal {
		return b, fmt.Errorf("pep: task %s: call binding does not match its digest", a.TaskID)
	}
	return b, nil
}

// digest is the JCS SHA-256 of tool and arguments (hex).
func digest(tool string, args map[string]any) (string, error) {
	c, err := authzen.Canonical(map[string]any{"tool": tool, "arguments": args})
	if err != nil {
		return "", err
	}
	s := sha256.Sum256(c)
	return hex.EncodeToString(s[:]), nil
}

// dedupKey identifies (principal, tool, arguments): a repeated call with all
// three equal returns the live task instead of opening a second approval.
func dedupKey(p Principal, tool, argsDigest string) string {
	if brokenBuild && broken(violateDedupOff) {
		return newKey()
	}
	if brokenBuild && broken(violateDedupAcrossPrincipals) {
		p = Principal{}
	}
	s := sha256.Sum256([]byte(p.Key() + "\x00" + tool + "\x00" + argsDigest))
	return hex.EncodeToString(s[:])
}

// evaluation is the AuthZEN request for a call (COAZ-style mapping):
// subject = the principal with its actor, action tools/call, resource the
// tool with its arguments.
func evaluation(p Principal, tool string, args map[string]any) authzen.EvaluationRequest {
	return authzen.EvaluationRequest{
		Subject:  p.Subject(),
		Action:   authzen.Object{"name": "tools/call"},
		Resource: authzen.Object{"type": "mcp_tool", "id": tool, "properties": map[string]any{"arguments": args}},
	}
}

// submission is the ARAP access request body for a denial of b.
func (g *Gate) submission(b binding, decision authzen.Decision, hint *authzen.AccessRequestHint, extra map[string]any, taskID string) ([]byte, error) {
	p := b.Principal
	ev := evaluation(p, b.Tool, b.Args)
	denial := map[string]any{"expires_at": hint.ExpiresAt.UTC().Format(time.RFC3339), "binding_token": hint.BindingToken}
	for _, k := range []string{authzen.CtxEvaluationID, authzen.CtxEvaluatedAt, authzen.CtxReason} {
		if v, ok := decision.Context[k]; ok {
			denial[k] = v
		}
	}
	if hint.Template != "" {
		denial["template"] = hint.Template
	}
	body := map[string]any{
		"subject": ev.Subject, "resource": ev.Resource, "action": ev.Action, "denial": denial,
		"client": map[string]any{"name": "arap MCP front-end", "actor": map[string]any{"id": p.ActorID, "type": "ai_agent"},
			"source": map[string]any{"integration_id": "mcp:" + b.Tool}},
	}
	if p.ActorID == "" {
		delete(body["client"].(map[string]any), "actor")
	}
	if len(extra) > 0 {
		body["context"] = extra
	}
	if g.cfg.CallbackURL != "" {
		body["callback"] = map[string]any{"endpoint": g.cfg.CallbackURL, "state": taskID}
	}
	return json.Marshal(body)
}

// submitURL is where a denial's request is submitted: the hint's endpoint,
// or the backend's requests endpoint.
func (g *Gate) submitURL(hint *authzen.AccessRequestHint) string {
	if hint.Endpoint != "" {
		return hint.Endpoint
	}
	return strings.TrimRight(g.cfg.Backend.BaseURL, "/") + authzen.PathRequests
}

// newKey is a fresh, high-entropy idempotency key for one submission.
func newKey() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return "pep_" + base64.RawURLEncoding.EncodeToString(b)
}
