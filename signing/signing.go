// Package signing owns the ES256 keys that sign binding_token (by the PDP) and
// approval.state (by the Access Request Service). Keys live in PostgreSQL so
// every replica signs and verifies with the same set; private keys are sealed
// with AES-256-GCM under a master key that never touches the database.
//
// Rotation creates a new key and retires the previous one: a retired key no
// longer signs but keeps verifying until its expiry, so tokens already issued
// stay valid. The JWKS lists every key that still verifies.
package signing

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"sort"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/internal/seal"
)

// Alg is the only JWS algorithm we issue and accept.
const Alg = "ES256"

// Token types, in the JWS "typ" header, keep one kind of token from being
// accepted as another.
const (
	TypeBinding  = "binding+jwt"
	TypeApproval = "approval+jwt"
	// TypePage is a search page token (arap/search.go): where a search goes on.
	TypePage = "page+jwt"
)

// DefaultVerifyWindow is how long a retired key keeps verifying. It covers the
// longest-lived token we sign: an approval.state lives until approved_until.
const DefaultVerifyWindow = 8 * 24 * time.Hour

// refreshEvery bounds how stale a replica's view of the key set may be.
const refreshEvery = 30 * time.Second

// JWK is a public key in JWK form (RFC 7517, EC P-256).
type JWK struct {
	Kty string `json:"kty"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
	Kid string `json:"kid"`
	Use string `json:"use"`
	Alg string `json:"alg"`
}

// JWKSet is a JWK Set document.
type JWKSet struct {
	Keys []JWK `json:"keys"`
}

type verifyKey struct {
	pub       *ecdsa.PublicKey
	jwk       JWK
	expiresAt time.Time // zero while the key is active
}

// Keys signs and verifies with the database's key set.
type Keys struct {
	db     *pgxpool.Pool
	box    *seal.Box
	now    func() time.Time
	mu     sync.RWMutex
	signer *ecdsa.PrivateKey
	kid    string
	verify map[string]verifyKey
	loaded time.Time
	// verified spares the signature check of a token signed or verified here
	// before (verified.go).
	verified verified
}

// Options configure Open.
type Options struct {
	// MasterKey (32 bytes) seals private keys at rest.
	MasterKey []byte
	// PreviousMasterKeys (32 bytes each) open values sealed before a master-key
	// rotation; they never seal.
	PreviousMasterKeys [][]byte
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Open loads the key set, creating the first key if there is none.
func Open(ctx context.Context, db *pgxpool.Pool, opts Options) (*Keys, error) {
	box, err := seal.New(opts.MasterKey, opts.PreviousMasterKeys...)
	if err != nil {
		return nil, fmt.Errorf("signing: %w", err)
	}
	k := &Keys{db: db, box: box, now: opts.Now}
	if k.now == nil {
		k.now = time.Now
	}
	if err := k.ensureKey(ctx); err != nil {
		return nil, err
	}
	if err := k.reload(ctx); err != nil {
		return nil, err
	}
	return k, nil
}

// lockKey serializes key creation and rotation across replicas.
const lockKey = 0x6b657973 // "keys"

func (k *Keys) ensureKey(ctx context.Context) error {
	return pgx.BeginFunc(ctx, k.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lockKey); err != nil {
			return fmt.Errorf("signing: lock: %w", err)
		}
		var n int
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM arap.signing_keys WHERE retired_at IS NULL").Scan(&n); err != nil {
			return fmt.Errorf("signing: count keys: %w", err)
		}
		if n > 0 {
			return nil
		}
		_, err := k.insertKey(ctx, tx)
		return err
	})
}

// Rotate makes a new signing key and retires the current one, which keeps
// verifying for verifyWindow. It returns the new key id. by names who asked,
// for the audit trail.
func (k *Keys) Rotate(ctx context.Context, verifyWindow time.Duration, by string) (string, error) {
	var kid string
	err := pgx.BeginFunc(ctx, k.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lockKey); err != nil {
			return fmt.Errorf("signing: lock: %w", err)
		}
		now := k.now()
		if _, err := tx.Exec(ctx, `UPDATE arap.signing_keys SET retired_at = $1, expires_at = $2 WHERE retired_at IS NULL`,
			now, now.Add(verifyWindow)); err != nil {
			return fmt.Errorf("signing: retire: %w", err)
		}
		var err error
		if kid, err = k.insertKey(ctx, tx); err != nil {
			return err
		}
		return audit.Append(ctx, tx, audit.Event{Chain: audit.SystemChain, Kind: "key.rotated", Actor: by, At: now,
			Data: map[string]any{"kid": kid, "retired_verify_until": now.Add(verifyWindow)}})
	})
	if err != nil {
		return "", err
	}
	return kid, k.reload(ctx)
}

func (k *Keys) insertKey(ctx context.Context, tx pgx.Tx) (string, error) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", fmt.Errorf("signing: generate: %w", err)
	}
	now := k.now()
	kid := fmt.Sprintf("k%s-%s", now.UTC().Format("20060102T150405"), randomSuffix())
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return "", err
	}
	sealed := k.box.Seal(der, kid)
	jwk := publicJWK(&priv.PublicKey, kid)
	if _, err := tx.Exec(ctx, `INSERT INTO arap.signing_keys (kid, alg, private_key, public_jwk, created_at) VALUES ($1, $2, $3, $4, $5)`,
		kid, Alg, sealed, jwk, now); err != nil {
		return "", fmt.Errorf("signing: insert key: %w", err)
	}
	return kid, nil
}

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x", b)
}

func publicJWK(pub *ecdsa.PublicKey, kid string) JWK {
	enc := func(n *big.Int) string { return base64.RawURLEncoding.EncodeToString(n.FillBytes(make([]byte, 32))) }
	return JWK{Kty: "EC", Crv: "P-256", X: enc(pub.X), Y: enc(pub.Y), Kid: kid, Use: "sig", Alg: Alg}
}

func (k *Keys) reload(ctx context.Context) error {
	// Expired keys are loaded too, so a token signed by one is refused as
	// "expired key" rather than "unknown key"; JWKS leaves them out.
	rows, err := k.db.Query(ctx, `SELECT kid, private_key, public_jwk, retired_at, expires_at FROM arap.signing_keys ORDER BY created_at`)
	if err != nil {
		return fmt.Errorf("signing: load keys: %w", err)
	}
	defer rows.Close()
	verify := map[string]verifyKey{}
	var signer *ecdsa.PrivateKey
	var signerKid string
	for rows.Next() {
		var kid string
		var sealed []byte
		var jwk JWK
		var retired, expires *time.Time
		if err := rows.Scan(&kid, &sealed, &jwk, &retired, &expires); err != nil {
			return fmt.Errorf("signing: scan key: %w", err)
		}
		pub, err := jwk.publicKey()
		if err != nil {
			return fmt.Errorf("signing: key %s: %w", kid, err)
		}
		vk := verifyKey{pub: pub, jwk: jwk}
		if expires != nil {
			vk.expiresAt = *expires
		}
		verify[kid] = vk
		if retired == nil {
			der, err := k.box.Open(sealed, kid)
			if err != nil {
				return fmt.Errorf("signing: unseal key %s (wrong master key?): %w", kid, err)
			}
			p, err := x509.ParsePKCS8PrivateKey(der)
			if err != nil {
				return fmt.Errorf("signing: parse key %s: %w", kid, err)
			}
			ep, ok := p.(*ecdsa.PrivateKey)
			if !ok {
				return fmt.Errorf("signing: key %s is not ECDSA", kid)
			}
			signer, signerKid = ep, kid
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("signing: load keys: %w", err)
	}
	if signer == nil {
		return errors.New("signing: no active signing key")
	}
	k.mu.Lock()
	k.signer, k.kid, k.verify, k.loaded = signer, signerKid, verify, k.now()
	k.mu.Unlock()
	return nil
}

func (j JWK) publicKey() (*ecdsa.PublicKey, error) {
	if j.Kty != "EC" || j.Crv != "P-256" {
		return nil, fmt.Errorf("unsupported key type %s/%s", j.Kty, j.Crv)
	}
	x, err1 := base64.RawURLEncoding.DecodeString(j.X)
	y, err2 := base64.RawURLEncoding.DecodeString(j.Y)
	if err1 != nil || err2 != nil {
		return nil, errors.New("bad coordinates")
	}
	pub := &ecdsa.PublicKey{Curve: elliptic.P256(), X: new(big.Int).SetBytes(x), Y: new(big.Int).SetBytes(y)}
	if !pub.Curve.IsOnCurve(pub.X, pub.Y) {
		return nil, errors.New("point not on curve")
	}
	return pub, nil
}

// refreshIfStale reloads the key set when it is older than refreshEvery, so a
// rotation made by another replica or by arapctl is picked up.
func (k *Keys) refreshIfStale(ctx context.Context) error {
	k.mu.RLock()
	stale := k.now().Sub(k.loaded) > refreshEvery
	k.mu.RUnlock()
	if !stale {
		return nil
	}
	return k.reload(ctx)
}

// Sign issues a compact JWS of claims with the active key.
func (k *Keys) Sign(ctx context.Context, typ string, claims jwt.Claims) (string, error) {
	if err := k.refreshIfStale(ctx); err != nil {
		return "", err
	}
	k.mu.RLock()
	signer, kid := k.signer, k.kid
	k.mu.RUnlock()
	t := jwt.NewWithClaims(jwt.SigningMethodES256, claims)
	t.Header["kid"] = kid
	t.Header["typ"] = typ
	s, err := t.SignedString(signer)
	if err != nil {
		return "", fmt.Errorf("signing: sign: %w", err)
	}
	if exp, err := claims.GetExpirationTime(); err == nil && exp != nil {
		k.verified.add(s, typ, kid, exp.Time)
	}
	return s, nil
}

// Verification errors. Callers map them to protocol errors.
var (
	ErrMalformed    = errors.New("not a compact JWS")
	ErrWrongType    = errors.New("wrong token type")
	ErrUnknownKey   = errors.New("signed with an unknown key")
	ErrKeyExpired   = errors.New("signed with a key that no longer verifies")
	ErrBadSignature = errors.New("signature does not verify")
)

// Verify checks the signature and type of token and decodes its claims. It
// does not validate registered claims (exp, aud, ...): callers do, in the
// order their protocol requires.
func (k *Keys) Verify(ctx context.Context, typ, token string, claims jwt.Claims) error {
	if err := k.refreshIfStale(ctx); err != nil {
		return err
	}
	parser := jwt.NewParser(jwt.WithValidMethods([]string{Alg}), jwt.WithoutClaimsValidation())
	now := k.now()
	if kid, ok := k.verified.get(token, typ, now); ok {
		// These exact bytes were signed (or verified) here with kid and typ,
		// and have not reached their exp: only the signature check is spared.
		// The key must still verify; anything else takes the full path,
		// which names the error.
		if vk, ok := k.lookup(kid); ok && (vk.expiresAt.IsZero() || now.Before(vk.expiresAt)) {
			if _, _, err := parser.ParseUnverified(token, claims); err == nil {
				return nil
			}
		}
	}
	var keyErr error
	var signedBy string
	_, err := parser.ParseWithClaims(token, claims, func(t *jwt.Token) (any, error) {
		if got, _ := t.Header["typ"].(string); got != typ {
			keyErr = fmt.Errorf("%w: typ %q, want %q", ErrWrongType, got, typ)
			return nil, keyErr
		}
		kid, _ := t.Header["kid"].(string)
		vk, ok := k.lookup(kid)
		if !ok {
			// Another replica may have rotated: reload once before refusing.
			if err := k.reload(ctx); err != nil {
				keyErr = err
				return nil, err
			}
			if vk, ok = k.lookup(kid); !ok {
				keyErr = fmt.Errorf("%w (kid %q)", ErrUnknownKey, kid)
				return nil, keyErr
			}
		}
		if !vk.expiresAt.IsZero() && !k.now().Before(vk.expiresAt) {
			keyErr = fmt.Errorf("%w (kid %q)", ErrKeyExpired, kid)
			return nil, keyErr
		}
		signedBy = kid
		return vk.pub, nil
	})
	switch {
	case err == nil:
		if exp, err := claims.GetExpirationTime(); err == nil && exp != nil {
			k.verified.add(token, typ, signedBy, exp.Time)
		}
		return nil
	case keyErr != nil:
		return keyErr
	case errors.Is(err, jwt.ErrTokenMalformed), errors.Is(err, jwt.ErrTokenUnverifiable):
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return ErrBadSignature
	default:
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
}

func (k *Keys) lookup(kid string) (verifyKey, bool) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	vk, ok := k.verify[kid]
	return vk, ok
}

// JWKS returns the public keys that still verify.
func (k *Keys) JWKS(ctx context.Context) (JWKSet, error) {
	if err := k.refreshIfStale(ctx); err != nil {
		return JWKSet{}, err
	}
	k.mu.RLock()
	defer k.mu.RUnlock()
	set := JWKSet{Keys: []JWK{}}
	now := k.now()
	for _, vk := range k.verify {
		if vk.expiresAt.IsZero() || now.Before(vk.expiresAt) {
			set.Keys = append(set.Keys, vk.jwk)
		}
	}
	sort.Slice(set.Keys, func(i, j int) bool { return set.Keys[i].Kid < set.Keys[j].Kid })
	return set, nil
}

// ActiveKid is the id of the key that signs now.
func (k *Keys) ActiveKid() string {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.kid
}

// MarshalJSON keeps private material out of any accidental encoding.
func (k *Keys) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]string{"active_kid": k.ActiveKid()})
}

// KeyInfo describes a stored key (public parts only).
type KeyInfo struct {
	Kid       string     `json:"kid"`
	Alg       string     `json:"alg"`
	CreatedAt time.Time  `json:"created_at"`
	RetiredAt *time.Time `json:"retired_at,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// List returns every stored key, oldest first; it needs no master key.
func List(ctx context.Context, db *pgxpool.Pool) ([]KeyInfo, error) {
	rows, err := db.Query(ctx, `SELECT kid, alg, created_at, retired_at, expires_at FROM arap.signing_keys ORDER BY created_at`)
	if err != nil {
		return nil, fmt.Errorf("signing: list: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (KeyInfo, error) {
		var k KeyInfo
		err := r.Scan(&k.Kid, &k.Alg, &k.CreatedAt, &k.RetiredAt, &k.ExpiresAt)
		return k, err
	})
}

// Sealed lists the columns this package seals under the master key, for a
// re-seal after a master-key rotation (internal/seal.Reseal).
var Sealed = []seal.Column{{Schema: "arap", Table: "signing_keys", Key: "kid", Value: "private_key", AD: "kid"}}
