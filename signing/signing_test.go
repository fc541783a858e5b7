package signing_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/signing"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

var master = []byte("0123456789abcdef0123456789abcdef")

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func TestSignVerifyRotateExpire(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	clk := &clock{t: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)}
	keys, err := signing.Open(ctx, db, signing.Options{MasterKey: master, Now: clk.Now})
	require.NoError(t, err)

	old, err := keys.Sign(ctx, signing.TypeBinding, jwt.MapClaims{"x": "1"})
	require.NoError(t, err)
	oldKid := keys.ActiveKid()

	var got jwt.MapClaims
	require.NoError(t, keys.Verify(ctx, signing.TypeBinding, old, &got))
	require.Equal(t, "1", got["x"])

	// A token of one type is not accepted as another.
	require.ErrorIs(t, keys.Verify(ctx, signing.TypeApproval, old, &jwt.MapClaims{}), signing.ErrWrongType)
	// A flipped signature byte fails.
	i := len(old) - 10
	tampered := old[:i] + flip(old[i]) + old[i+1:]
	require.ErrorIs(t, keys.Verify(ctx, signing.TypeBinding, tampered, &jwt.MapClaims{}), signing.ErrBadSignature)
	require.ErrorIs(t, keys.Verify(ctx, signing.TypeBinding, "not-a-jws", &jwt.MapClaims{}), signing.ErrMalformed)

	newKid, err := keys.Rotate(ctx, time.Hour, "test")
	require.NoError(t, err)
	require.NotEqual(t, oldKid, newKid)
	fresh, err := keys.Sign(ctx, signing.TypeBinding, jwt.MapClaims{"x": "2"})
	require.NoError(t, err)
	require.NoError(t, keys.Verify(ctx, signing.TypeBinding, fresh, &jwt.MapClaims{}))
	// The retired key still verifies within its window and is still published.
	require.NoError(t, keys.Verify(ctx, signing.TypeBinding, old, &jwt.MapClaims{}))
	set, err := keys.JWKS(ctx)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{oldKid, newKid}, kids(set))
	for _, k := range set.Keys {
		require.Equal(t, "sig", k.Use)
		require.Equal(t, "ES256", k.Alg)
	}

	// After the window the old key neither verifies nor is published.
	clk.Add(time.Hour + time.Second)
	require.ErrorIs(t, keys.Verify(ctx, signing.TypeBinding, old, &jwt.MapClaims{}), signing.ErrKeyExpired)
	clk.Add(time.Minute) // past the refresh interval: the expired key drops out
	set, err = keys.JWKS(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{newKid}, kids(set))
	require.NoError(t, keys.Verify(ctx, signing.TypeBinding, fresh, &jwt.MapClaims{}))
}

func TestOtherReplicaSeesRotationOnUnknownKid(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	a, err := signing.Open(ctx, db, signing.Options{MasterKey: master})
	require.NoError(t, err)
	b, err := signing.Open(ctx, db, signing.Options{MasterKey: master})
	require.NoError(t, err)
	require.Equal(t, a.ActiveKid(), b.ActiveKid(), "replicas share one key")
	_, err = a.Rotate(ctx, time.Hour, "test")
	require.NoError(t, err)
	tok, err := a.Sign(ctx, signing.TypeApproval, jwt.MapClaims{})
	require.NoError(t, err)
	require.NoError(t, b.Verify(ctx, signing.TypeApproval, tok, &jwt.MapClaims{}))
}

func TestConcurrentOpenCreatesOneKey(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	var wg sync.WaitGroup
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := signing.Open(ctx, db, signing.Options{MasterKey: master})
			require.NoError(t, err)
		}()
	}
	wg.Wait()
	var n int
	require.NoError(t, db.QueryRow(ctx, "SELECT count(*) FROM arap.signing_keys").Scan(&n))
	require.Equal(t, 1, n)
}

func TestPrivateKeysAreSealed(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	_, err := signing.Open(ctx, db, signing.Options{MasterKey: master})
	require.NoError(t, err)
	other := []byte("ffffffffffffffffffffffffffffffff")
	_, err = signing.Open(ctx, db, signing.Options{MasterKey: other})
	require.ErrorContains(t, err, "wrong master key")
	_, err = signing.Open(ctx, db, signing.Options{MasterKey: []byte("short")})
	require.ErrorContains(t, err, "32 bytes")
}

func kids(s signing.JWKSet) []string {
	var out []string
	for _, k := range s.Keys {
		out = append(out, k.Kid)
	}
	return out
}

func flip(c byte) string {
	if c == 'A' {
		return "B"
	}
	return "A"
}
