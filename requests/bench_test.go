package requests_test

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkSubmit is the Access Request Service's cost for one submission
// with an Idempotency-Key: checks, binding_token verification and the
// creating transaction. The denials are made beforehand, untimed.
func BenchmarkSubmit(b *testing.B) {
	f := setup(b)
	ctx := context.Background()
	bodies := make([][]byte, 0, 4096)
	for i := range cap(bodies) {
		bodies = append(bodies, f.fresh("wire_transfer", map[string]any{"to": fmt.Sprint("acct-", i), "amount": 50000}))
	}
	b.ReportAllocs()
	b.ResetTimer()
	i, n := 0, 0
	for b.Loop() {
		if i == len(bodies) {
			b.StopTimer()
			for j := range bodies {
				bodies[j] = f.fresh("wire_transfer", map[string]any{"to": fmt.Sprint("acct-", i, "-", j), "amount": 50000})
			}
			i = 0
			b.StartTimer()
		}
		if _, err := f.svc.Submit(ctx, f.pep, fmt.Sprint("key-", n), bodies[i]); err != nil {
			b.Fatal(err)
		}
		i++
		n++
	}
}
