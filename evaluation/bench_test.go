package evaluation_test

import (
	"context"
	"testing"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/evaluation"
)

// BenchmarkEvaluateRequestable is the PDP's cost for a requestable denial:
// matching, the CEL condition, the binding hash and the ES256 binding_token.
func BenchmarkEvaluateRequestable(b *testing.B) {
	e, _ := setup(b)
	ctx := context.Background()
	req := call("wire_transfer", map[string]any{"to": "acct-991", "amount": 50000.0})
	b.ReportAllocs()
	for b.Loop() {
		out, err := e.Evaluate(ctx, "client-1", req)
		if err != nil || out.Decision.Decision {
			b.Fatalf("%v %v", out, err)
		}
	}
}

// BenchmarkEvaluateTodo is the cost of a decision that reads subject
// attributes (from the Todo example's file source) through definitions:
// an editor updating their own todo, the longest path of that policy.
func BenchmarkEvaluateTodo(b *testing.B) {
	p, err := evaluation.LoadFile("../docs/examples/todo/policy.yaml")
	if err != nil {
		b.Fatal(err)
	}
	e, _ := setup(b)
	e.SetPolicy(p)
	ctx := context.Background()
	req := authzen.EvaluationRequest{
		Subject:  authzen.Object{"type": "user", "id": "morty@the-citadel.com"},
		Action:   authzen.Object{"name": "can_update_todo"},
		Resource: authzen.Object{"type": "todo", "id": "1", "properties": map[string]any{"ownerID": "morty@the-citadel.com"}},
	}
	b.ReportAllocs()
	for b.Loop() {
		out, err := e.Evaluate(ctx, "client-1", req)
		if err != nil || !out.Decision.Decision {
			b.Fatalf("%v %v", out, err)
		}
	}
}

// BenchmarkEvaluateAllow is the PDP's cost for an allowed call of the dev
// policy, arapbench's evaluate-allow: a small wire_transfer, which passes
// the conditions of the two rules before the one that allows it (hidden
// characters, the hard limit) and that rule's own, and signs nothing.
func BenchmarkEvaluateAllow(b *testing.B) {
	p, err := evaluation.LoadFile("../internal/dev/policy.yaml")
	if err != nil {
		b.Fatal(err)
	}
	e, _ := setup(b)
	e.SetPolicy(p)
	ctx := context.Background()
	req := benchCall(100)
	b.ReportAllocs()
	for b.Loop() {
		out, err := e.Evaluate(ctx, "client-1", req)
		if err != nil || !out.Decision.Decision {
			b.Fatalf("%v %v", out, err)
		}
	}
}

// BenchmarkValidateRequest is the check of every evaluation request
// before the PDP sees it: the AuthZEN schema and the subject's identities.
func BenchmarkValidateRequest(b *testing.B) {
	req := benchCall(100)
	b.ReportAllocs()
	for b.Loop() {
		if v := evaluation.ValidateRequest(req); len(v) > 0 {
			b.Fatal(v)
		}
	}
}

// benchCall is arapbench's evaluation request, as the backend decodes it.
func benchCall(amount float64) authzen.EvaluationRequest {
	return authzen.EvaluationRequest{
		Subject:  authzen.Object{"type": "user", "id": "alice", "properties": map[string]any{"act": map[string]any{"sub": "agent:demo"}}},
		Action:   authzen.Object{"name": "tools/call"},
		Resource: authzen.Object{"type": "mcp_tool", "id": "wire_transfer", "properties": map[string]any{"arguments": map[string]any{"to": "acct-991", "amount": amount}}},
	}
}
