package signing

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"
)

// TestVerifiedIsBoundedAndEndsAtExp: the memory of verified tokens never
// holds more than MaxVerified, forgets the oldest first, answers only for the
// type it was given and only before the token's exp, and remembers nothing
// for a token without exp.
func TestVerifiedIsBoundedAndEndsAtExp(t *testing.T) {
	now := time.Unix(1_900_000_000, 0)
	var v verified
	for i := range MaxVerified + 10 {
		v.add(fmt.Sprint("t", i), TypeBinding, "k1", now.Add(time.Minute))
	}
	require.Equal(t, MaxVerified, v.len())
	_, ok := v.get("t0", TypeBinding, now)
	require.False(t, ok, "the oldest is forgotten first")
	last := fmt.Sprint("t", MaxVerified+9)
	kid, ok := v.get(last, TypeBinding, now)
	require.True(t, ok)
	require.Equal(t, "k1", kid)
	_, ok = v.get(last, TypeApproval, now)
	require.False(t, ok, "only for its type")
	_, ok = v.get(last, TypeBinding, now.Add(time.Minute))
	require.False(t, ok, "not at its exp")

	k, _ := fuzzKeys(t, now)
	ctx := context.Background()
	tok, err := k.Sign(ctx, TypeBinding, jwt.MapClaims{"x": "1"})
	require.NoError(t, err)
	require.NoError(t, k.Verify(ctx, TypeBinding, tok, &jwt.MapClaims{}))
	require.Zero(t, k.verified.len(), "a token without exp is never remembered")
	tok, err = k.Sign(ctx, TypeBinding, jwt.MapClaims{"exp": float64(now.Add(time.Minute).Unix())})
	require.NoError(t, err)
	_, ok = k.verified.get(tok, TypeBinding, now)
	require.True(t, ok, "a token signed here is remembered")
}
