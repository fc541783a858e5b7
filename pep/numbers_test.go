package pep_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/mcp/tasks"
)

// TestNumbersKeptExactly: a number a 64-bit float cannot hold as written
// (beyond its precision or its range), anywhere in a call's arguments, is
// refused with -32602 naming where it is, before the policy, the binding
// hash or an upstream sees a rounded one; numbers a float holds (0.1 as its
// shortest text, a subnormal written as such) pass.
func TestNumbersKeptExactly(t *testing.T) {
	t.Parallel()
	p := newPEP(t, pepOptions{})
	ctx := context.Background()
	alice := &tasks.Client{URL: p.url, Token: aliceToken}
	// 1e400 is refused earlier, by the SDK's Mcp-Name check, which
	// cannot decode the params (-32020).
	for _, raw := range []string{`12345678901234567890`, `0.30000000000000000001`} {
		r, err := alice.Call(ctx, "tools/call", "get_balance", map[string]any{"name": "get_balance", "arguments": map[string]any{"account": map[string]any{"n": json.Number(raw)}}})
		require.NoError(t, err)
		require.NotNil(t, r.Error, "%s: %s", raw, r.Raw)
		require.Equal(t, tasks.CodeInvalidParams, r.Error.Code, raw)
		require.Contains(t, r.Error.Message, "account/n: the number "+raw+" cannot be kept exactly", raw)
	}
	for _, raw := range []string{`0.1`, `1e-320`, `50000.25`} {
		r, err := alice.Call(ctx, "tools/call", "get_balance", map[string]any{"name": "get_balance", "arguments": map[string]any{"account": map[string]any{"n": json.Number(raw)}}})
		require.NoError(t, err)
		if r.Error != nil {
			require.NotContains(t, r.Error.Message, "cannot be kept exactly", raw)
		}
	}
}
