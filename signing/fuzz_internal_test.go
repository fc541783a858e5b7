package signing

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// fuzzKeys is a key set in memory: an active key "k1" and a retired key
// "old" that no longer verifies. Its database is unreachable, so a token
// naming any other kid fails the reload Verify attempts, as it would
// against a database that has no such key.
func fuzzKeys(tb testing.TB, now time.Time) (*Keys, *ecdsa.PrivateKey) {
	active, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(tb, err)
	old, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(tb, err)
	pool, err := pgxpool.New(context.Background(), "postgres://fuzz@127.0.0.1:1/none?connect_timeout=1")
	require.NoError(tb, err)
	tb.Cleanup(pool.Close)
	return &Keys{db: pool, now: func() time.Time { return now }, signer: active, kid: "k1", loaded: now,
		verify: map[string]verifyKey{
			"k1":  {pub: &active.PublicKey, jwk: publicJWK(&active.PublicKey, "k1")},
			"old": {pub: &old.PublicKey, jwk: publicJWK(&old.PublicKey, "old"), expiresAt: now.Add(-time.Hour)},
		}}, old
}

// FuzzVerifyToken feeds arbitrary compact JWS strings to Verify, as a
// binding_token arrives in a submission: nothing panics; every refusal is
// one of the typed errors (or the failed key reload for an unknown kid);
// and a token that verifies carries our type, algorithm and active key and
// exactly the claims we signed.
func FuzzVerifyToken(f *testing.F) {
	now := time.Unix(1_900_000_000, 0)
	k, old := fuzzKeys(f, now)
	ctx := context.Background()
	claims := jwt.MapClaims{"iss": "https://arap.test", "aud": "https://arap.test/access/v1/requests", "jti": "j1", "binding_hash": "abc"}
	binding, err := k.Sign(ctx, TypeBinding, claims)
	require.NoError(f, err)
	signed := map[string]bool{strings.Split(binding, ".")[1]: true}
	approval, err := k.Sign(ctx, TypeApproval, claims)
	require.NoError(f, err)
	expired := jwt.NewWithClaims(jwt.SigningMethodES256, claims)
	expired.Header["kid"], expired.Header["typ"] = "old", TypeBinding
	expiredTok, err := expired.SignedString(old)
	require.NoError(f, err)
	none := jwt.NewWithClaims(jwt.SigningMethodNone, claims)
	none.Header["kid"], none.Header["typ"] = "k1", TypeBinding
	noneTok, err := none.SignedString(jwt.UnsafeAllowNoneSignatureType)
	require.NoError(f, err)
	hs := jwt.NewWithClaims(jwt.SigningMethodHS256, claims)
	hs.Header["kid"], hs.Header["typ"] = "k1", TypeBinding
	hsTok, err := hs.SignedString([]byte(k.verify["k1"].jwk.X))
	require.NoError(f, err)
	parts := strings.Split(binding, ".")
	for _, s := range []string{binding, approval, expiredTok, noneTok, hsTok, "", "a.b.c", "..", binding + ".x", parts[0] + "." + parts[1] + ".",
		parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(`{"iss":"evil"}`)) + "." + parts[2], strings.Replace(binding, "e", "f", 1)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, token string) {
		var got jwt.MapClaims
		err := k.Verify(ctx, TypeBinding, token, &got)
		if err != nil {
			typed := errors.Is(err, ErrMalformed) || errors.Is(err, ErrWrongType) || errors.Is(err, ErrUnknownKey) ||
				errors.Is(err, ErrKeyExpired) || errors.Is(err, ErrBadSignature) || strings.HasPrefix(err.Error(), "signing: load keys")
			require.True(t, typed, "untyped refusal: %v", err)
			return
		}
		segs := strings.Split(token, ".")
		require.Len(t, segs, 3)
		hdr, err := base64.RawURLEncoding.DecodeString(segs[0])
		require.NoError(t, err)
		var h map[string]any
		require.NoError(t, json.Unmarshal(hdr, &h))
		require.Equal(t, TypeBinding, h["typ"])
		require.Equal(t, Alg, h["alg"])
		require.Equal(t, "k1", h["kid"])
		payload, err := base64.RawURLEncoding.DecodeString(segs[1])
		require.NoError(t, err)
		want, _ := base64.RawURLEncoding.DecodeString(parts[1])
		require.True(t, signed[segs[1]] || string(payload) == string(want), "verified claims we never signed: %s", payload)
	})
}
