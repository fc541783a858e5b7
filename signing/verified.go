package signing

import (
	"crypto/sha256"
	"sync"
	"time"
)

// MaxVerified bounds the tokens a Keys remembers as verified. At the PDP's
// evaluation rate on two cores (about 10,000 a second) it covers a few
// seconds of denials, the time between a PEP's evaluation and its submission
// on the gate's path; an entry costs about 100 bytes.
const MaxVerified = 32768

// verified remembers tokens whose signature this process made or checked,
// keyed by the SHA-256 of the token's bytes, until the token's exp: the
// Access Request Service verifies binding_tokens its own PDP signed moments
// earlier, and an ES256 verification is its largest CPU cost. Only the
// signature check is skipped on a hit; the type, the key's standing and the
// claims are checked and decoded as for any token (Verify).
type verified struct {
	mu   sync.Mutex
	m    map[[sha256.Size]byte]verifiedToken
	ring [][sha256.Size]byte // insertion order, for eviction: oldest first out
	next int
}

type verifiedToken struct {
	typ, kid string
	exp      time.Time
}

// add remembers token as signed by kid with type typ until exp.
func (v *verified) add(token, typ, kid string, exp time.Time) {
	sum := sha256.Sum256([]byte(token))
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m == nil {
		v.m = make(map[[sha256.Size]byte]verifiedToken)
		v.ring = make([][sha256.Size]byte, MaxVerified)
	}
	if _, ok := v.m[sum]; ok {
		return
	}
	if len(v.m) == MaxVerified {
		delete(v.m, v.ring[v.next])
	}
	v.m[sum] = verifiedToken{typ: typ, kid: kid, exp: exp}
	v.ring[v.next] = sum
	v.next = (v.next + 1) % MaxVerified
}

// get returns the kid that signed token if it is remembered with type typ and
// now is before its exp.
func (v *verified) get(token, typ string, now time.Time) (string, bool) {
	sum := sha256.Sum256([]byte(token))
	v.mu.Lock()
	e, ok := v.m[sum]
	v.mu.Unlock()
	if !ok || e.typ != typ || !now.Before(e.exp) {
		return "", false
	}
	return e.kid, true
}

func (v *verified) len() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.m)
}
