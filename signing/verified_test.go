package signing_test

import (
	"context"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/signing"
)

// TestRememberedTokensKeepEveryCheck: a token this process signed is verified
// from memory (no signature check), yet every other check of Verify holds:
// its type, its key's standing (expired after rotation, unknown after
// deletion), and the claims it decodes; and an altered token is checked in
// full.
func TestRememberedTokensKeepEveryCheck(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	clk := &clock{t: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)}
	keys, err := signing.Open(ctx, db, signing.Options{MasterKey: master, Now: clk.Now})
	require.NoError(t, err)
	exp := jwt.NewNumericDate(clk.Now().Add(2 * time.Hour))
	tok, err := keys.Sign(ctx, signing.TypeBinding, jwt.MapClaims{"x": "1", "exp": float64(exp.Unix())})
	require.NoError(t, err)

	var got jwt.MapClaims
	require.NoError(t, keys.Verify(ctx, signing.TypeBinding, tok, &got))
	require.Equal(t, "1", got["x"], "claims are decoded from a remembered token")
	require.ErrorIs(t, keys.Verify(ctx, signing.TypeApproval, tok, &jwt.MapClaims{}), signing.ErrWrongType)
	i := len(tok) - 10
	require.ErrorIs(t, keys.Verify(ctx, signing.TypeBinding, tok[:i]+flip(tok[i])+tok[i+1:], &jwt.MapClaims{}), signing.ErrBadSignature)

	// Its key retired and past its verify window: refused, though remembered
	// and before its exp.
	_, err = keys.Rotate(ctx, time.Hour, "test")
	require.NoError(t, err)
	require.NoError(t, keys.Verify(ctx, signing.TypeBinding, tok, &jwt.MapClaims{}))
	clk.Add(time.Hour + time.Second)
	require.ErrorIs(t, keys.Verify(ctx, signing.TypeBinding, tok, &jwt.MapClaims{}), signing.ErrKeyExpired)

	// Its key deleted (another replica's view): refused as unknown.
	tok2, err := keys.Sign(ctx, signing.TypeBinding, jwt.MapClaims{"exp": float64(clk.Now().Add(time.Hour).Unix())})
	require.NoError(t, err)
	require.NoError(t, keys.Verify(ctx, signing.TypeBinding, tok2, &jwt.MapClaims{}))
	_, err = db.Exec(ctx, `DELETE FROM arap.signing_keys`)
	require.NoError(t, err)
	clk.Add(time.Minute) // past the refresh interval: the reload finds no key
	require.Error(t, keys.Verify(ctx, signing.TypeBinding, tok2, &jwt.MapClaims{}))
}
