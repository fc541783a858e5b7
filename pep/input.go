package pep

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"slices"
	"sort"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/schemamsg"
	"github.com/omcp/arap/mcp/tasks"
)

// inputKeyPrefix names input requests; keys carry a nonce so none is ever
// reused within a task.
const inputKeyPrefix = "justification-"

// inputAnswers are the accepted answers of an MRTR retry: to the gate's own
// question (declined, content), or to an upstream's (relayed).
type inputAnswers struct {
	declined bool
	content  map[string]any
	relayed  *mrtrState
}

// mrtrState is the requestState: the immutable binding of the first call
// (principal, tool, argument digest), a single-use nonce and an expiry,
// sealed so the client can neither read nor forge it. The gate's own round
// names its question (Key); a round an upstream started and the gate
// relayed (Relayed) names the upstream and its tool that asked, and
// carries the upstream's own requestState (UpState) to give back to it.
type mrtrState struct {
	Nonce        string    `json:"n"`
	Principal    string    `json:"p"`
	Tool         string    `json:"t"`
	Digest       string    `json:"d"`
	Key          string    `json:"k,omitempty"`
	Expires      time.Time `json:"e"`
	Relayed      bool      `json:"r,omitempty"`
	Upstream     string    `json:"u,omitempty"`
	UpstreamTool string    `json:"ut,omitempty"`
	UpState      string    `json:"us,omitempty"`
}

const stateAAD = "mcp:requestState"

func (g *Gate) sealState(s mrtrState) string {
	b, _ := json.Marshal(s)
	return base64.RawURLEncoding.EncodeToString(g.box.Seal(b, stateAAD))
}

// openState reads a requestState this server sealed, refusing (invalid
// params) one it did not seal or that has expired.
func (g *Gate) openState(s string) (mrtrState, error) {
	invalid := func(msg string) error { return rpcError(tasks.CodeInvalidParams, msg) }
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return mrtrState{}, invalid("requestState is not one this server issued")
	}
	plain, err := g.box.Open(raw, stateAAD)
	if err != nil {
		return mrtrState{}, invalid("requestState is not one this server issued")
	}
	var st mrtrState
	if json.Unmarshal(plain, &st) != nil {
		return mrtrState{}, invalid("requestState is not one this server issued")
	}
	if g.now().After(st.Expires) {
		return mrtrState{}, invalid("requestState has expired; call the tool again")
	}
	return st, nil
}

// resume checks an MRTR retry against the binding carried in its
// requestState: same principal, tool and arguments (and, for a relayed
// round, the same upstream and upstream tool behind the name), not
// expired, not used before. It returns the accepted answers. A retry
// refused here has changed nothing.
func (g *Gate) resume(ctx context.Context, p Principal, t *offered, args map[string]any, req *sdk.CallToolRequest) (*inputAnswers, error) {
	invalid := func(msg string) error { return rpcError(tasks.CodeInvalidParams, msg) }
	tool := t.Name
	st, err := g.openState(req.Params.RequestState)
	if err != nil {
		return nil, err
	}
	d, err := digest(tool, args)
	if err != nil {
		return nil, err
	}
	if brokenBuild && broken(violateMRTRUnbound) { // any retry, by anyone, any number of times
		st.Principal, st.Tool, st.Digest, st.Nonce = p.Key(), tool, d, newKey()
	}
	if st.Principal != p.Key() || st.Tool != tool || st.Digest != d {
		return nil, invalid("the retry does not match the original call: the tool, its arguments and the caller must be unchanged")
	}
	if st.Relayed && (st.Upstream != t.Upstream || st.UpstreamTool != t.upstreamTool()) {
		return nil, invalid("the retry's requestState belongs to another upstream tool than the one now offered under this name; call the tool again")
	}
	tag, err := g.cfg.DB.Exec(ctx, `INSERT INTO pep.used_states (nonce, expires_at) VALUES ($1, $2) ON CONFLICT DO NOTHING`, st.Nonce, st.Expires)
	if err != nil {
		return nil, err
	}
	if tag.RowsAffected() == 0 {
		return nil, invalid("requestState was already used; call the tool again")
	}
	if st.Relayed {
		return &inputAnswers{relayed: &st}, nil // the answers are the upstream's to read
	}
	resp, ok := req.Params.InputResponses[st.Key]
	if !ok {
		return &inputAnswers{}, nil // no answer: ask again
	}
	var ans struct {
		Action  string         `json:"action"`
		Content map[string]any `json:"content"`
	}
	b, _ := json.Marshal(resp)
	_ = json.Unmarshal(b, &ans)
	if ans.Action != "accept" {
		return &inputAnswers{declined: true}, nil
	}
	return &inputAnswers{content: ans.Content}, nil
}

// contextFields is the part of a request schema describing the context
// members a submission must add, as an elicitation form: flat, primitive
// fields only (what a person or an agent can fill in).
func contextFields(schema map[string]any) (form map[string]any, required []string) {
	props, _ := schema["properties"].(map[string]any)
	ctxSchema, _ := props["context"].(map[string]any)
	fields, _ := ctxSchema["properties"].(map[string]any)
	for _, r := range asStrings(ctxSchema["required"]) {
		if _, ok := fields[r]; ok {
			required = append(required, r)
		}
	}
	out := map[string]any{}
	for name, f := range fields {
		fm, _ := f.(map[string]any)
		t, _ := fm["type"].(string)
		if !slices.Contains([]string{"string", "number", "integer", "boolean"}, t) {
			continue
		}
		clean := map[string]any{}
		for _, k := range []string{"type", "title", "description", "minLength", "maxLength", "minimum", "maximum", "enum", "format", "default"} {
			if v, ok := fm[k]; ok {
				clean[k] = v
			}
		}
		out[name] = clean
	}
	sort.Strings(required)
	return map[string]any{"type": "object", "properties": out, "required": required}, required
}

func asStrings(v any) []string {
	var out []string
	l, _ := v.([]any)
	for _, x := range l {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// validateAnswers checks answers against the backend's request schema and
// returns what is wrong, naming the form's fields (the context's members) as
// the agent was asked for them.
func validateAnswers(schema map[string]any, answers map[string]any) []string {
	c := jsonschema.NewCompiler()
	if err := c.AddResource("urn:arap:request-schema", toJSONValue(schema)); err != nil {
		return []string{"the request schema cannot be used: " + err.Error()}
	}
	sch, err := c.Compile("urn:arap:request-schema")
	if err != nil {
		return []string{"the request schema cannot be used: " + oneLine(err.Error())}
	}
	return schemamsg.Messages(sch.Validate(map[string]any{"context": toJSONValue(answers)}), "context")
}

// collectInput gathers what the backend requires before it accepts the
// request (its request_schema_url) through MRTR on the original call. It
// returns the context members to add, or the input_required result to send.
func (g *Gate) collectInput(ctx context.Context, p Principal, tool string, args map[string]any, hint *authzen.AccessRequestHint, answers *inputAnswers) (map[string]any, sdk.Result, error) {
	if hint.RequestSchemaURL == "" {
		return nil, nil, nil
	}
	schema, err := g.requestSchema(ctx, hint.RequestSchemaURL)
	if err != nil {
		g.cfg.Log.ErrorContext(ctx, "request schema unavailable", "error", err)
		if backendUnavailable(err) {
			return nil, nil, tasks.Unavailable(tasks.WhatApproval)
		}
		return nil, nil, rpcError(tasks.CodeInternalError, "the approval service is unavailable; try again later")
	}
	form, required := contextFields(schema)
	if len(required) == 0 {
		return nil, nil, nil
	}
	problem := ""
	if answers != nil {
		if answers.declined {
			return nil, denied("The approval request was not made: the requested information was declined. The tool did not run.", RemediationUnavailable), nil
		}
		if answers.content != nil {
			v := validateAnswers(schema, answers.content)
			if len(v) == 0 {
				return answers.content, nil, nil
			}
			problem = " The previous answer was not accepted: " + sanitize(schemamsg.Join(v), 300) + "."
		}
	}
	d, err := digest(tool, args)
	if err != nil {
		return nil, nil, err
	}
	nonce := newKey()
	key := inputKeyPrefix + nonce[4:14]
	msg := "This call needs an approval (" + describe(hint) + "). Please provide the information the approvers need." + problem
	// An MRTR round (SEP-2322): the SDK marks it input_required.
	return nil, &sdk.CallToolResult{
		InputRequests: sdk.InputRequestMap{key: &sdk.ElicitParams{Mode: "form", Message: msg, RequestedSchema: form}},
		RequestState:  g.sealState(mrtrState{Nonce: nonce, Principal: p.Key(), Tool: tool, Digest: d, Key: key, Expires: g.now().Add(g.cfg.StateTTL)}),
	}, nil
}

// relayInput is the input_required result that relays an upstream's
// question on a call that ran directly: the upstream's input requests as
// they came, and a requestState of the gate's (sealed like its own, bound
// to the principal, the tool and its arguments, the upstream and its tool,
// single use, expiring) that carries the upstream's requestState back to
// it with the caller's answers.
func (g *Gate) relayInput(p Principal, t *offered, args map[string]any, in *UpstreamInput) (sdk.Result, error) {
	d, err := digest(t.Name, args)
	if err != nil {
		return nil, err
	}
	reqs := in.Requests
	if reqs == nil {
		reqs = sdk.InputRequestMap{} // a round without questions: retry with the state
	}
	return &sdk.CallToolResult{
		InputRequests: reqs,
		RequestState: g.sealState(mrtrState{Nonce: newKey(), Principal: p.Key(), Tool: t.Name, Digest: d, Expires: g.now().Add(g.cfg.StateTTL),
			Relayed: true, Upstream: t.Upstream, UpstreamTool: t.upstreamTool(), UpState: in.State}),
	}, nil
}
