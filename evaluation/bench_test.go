package evaluation_test

import (
	"context"
	"testing"
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
