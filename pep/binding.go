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

// Messages of a call that may not run because its tool changed.
const (
	msgToolGone    = "The tool is no longer offered as it was when the call was approved; the tool did not run."
	msgToolChanged = "The tool's definition (its description, schema or annotations) changed after the call was approved; the approval does not carry over and the tool did not run. Call it again to ask for a new approval."
	msgArgsStale   = "The approved arguments no longer fit the tool's current input schema; the tool did not run."
)

// current is the tool a's call was approved for, as its source offers it
// now, if it is still that tool: the same definition (digest, recorded at
// open; it covers the upstream and upstream tool too) and the stored
// arguments valid against its current input schema. Otherwise it returns
// why the call may not run: an approval never carries over to a changed
// tool (SEP-2848: a material change while pending fails closed). A task
// opened before the digest was recorded is checked against the schema only.
func (g *Gate) current(a *approvalTask, b binding) (*offered, string, error) {
	tool, err := g.catalog.lookup(a.Tool)
	if err != nil {
		if a.Upstream != nil && !g.catalog.connected(*a.Upstream) {
			// Its upstream is not connected (starting, reconnecting): its
			// tools are unknown now, not gone. Decided later.
			return nil, "", fmt.Errorf("pep: upstream %s is not connected; the task waits", *a.Upstream)
		}
		return nil, msgToolGone, nil
	}
	if a.ToolDigest != nil && tool.Digest != *a.ToolDigest {
		return nil, msgToolChanged, nil
	}
	if err := tool.schema.Validate(toJSONValue(b.Args)); err != nil {
		return nil, msgArgsStale, nil
	}
	return tool, "", nil
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
// tool (its exposed name) with its arguments, upstream and annotations
// (resourceProperties).
func evaluation(p Principal, tool *Tool, args map[string]any) authzen.EvaluationRequest {
	return authzen.EvaluationRequest{
		Subject:  p.Subject(),
		Action:   authzen.Object{"name": "tools/call"},
		Resource: authzen.Object{"type": "mcp_tool", "id": tool.Name, "properties": resourceProperties(tool, args)},
	}
}

// submission is the ARAP access request body for a denial of b, a call of
// tool.
func (g *Gate) submission(tool *Tool, b binding, decision authzen.Decision, hint *authzen.AccessRequestHint, extra map[string]any, taskID string) ([]byte, error) {
	p := b.Principal
	ev := evaluation(p, tool, b.Args)
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
