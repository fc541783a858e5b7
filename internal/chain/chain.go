// Package chain is the hash-chain construction of the audit trails, a leaf
// that both parties may use without importing each other (the backend's
// audit/, the MCP front-end's pep.audit_events).
//
// A chain is a sequence of events numbered 1, 2, ... Each event's hash is
// SHA-256(prev || JCS(fields)), where prev is the previous event's hash
// (empty for the first) and fields holds every stored field of the event
// other than the two hashes: its chain, its seq, its time, its kind, its
// data, all of them. A changed field, a removed or reordered event, or a
// rewritten link then breaks the chain where it happened. Removing the last
// events leaves a chain that still links; the head (the last seq and hash)
// is therefore recorded separately, in the same transaction as each append,
// and a verifier compares the chain's end with it.
package chain

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"time"

	"github.com/omcp/arap/authzen"
)

// Hash is one event's hash: SHA-256(prev || JCS(fields)). fields must hold
// every stored field of the event but the hashes, in a form that survives
// the store (times through Time, JSON data as json.RawMessage).
func Hash(prev []byte, fields map[string]any) ([]byte, error) {
	canon, err := authzen.Canonical(fields)
	if err != nil {
		return nil, fmt.Errorf("chain: canonical form: %w", err)
	}
	h := sha256.New()
	h.Write(prev)
	h.Write(canon)
	return h.Sum(nil), nil
}

// Time is the form of a time in fields: UTC, microseconds (what PostgreSQL
// keeps), RFC 3339.
func Time(t time.Time) string {
	return t.UTC().Truncate(time.Microsecond).Format(time.RFC3339Nano)
}

// Link is a stored event as a verifier reads it.
type Link struct {
	Seq    int64
	Prev   []byte // as stored
	Hash   []byte // as stored
	Fields map[string]any
}

// Head is a chain's recorded end: its last seq and that event's hash.
type Head struct {
	Seq  int64
	Hash []byte
}

// Verifier checks one chain, link by link in stored (seq) order, without
// holding it in memory. It keeps the first problem found.
type Verifier struct {
	prev    []byte
	want    int64
	seen    int64
	problem string
	at      int64
	err     error
}

// Add checks the next stored link.
func (v *Verifier) Add(l Link) {
	if v.want == 0 {
		v.want = 1
	}
	v.seen++
	if v.problem != "" || v.err != nil {
		return
	}
	fail := func(p string) { v.problem, v.at = p, l.Seq }
	switch {
	case l.Seq != v.want:
		fail(fmt.Sprintf("sequence gap: expected seq %d (an event was removed or reordered)", v.want))
	case !bytes.Equal(l.Prev, v.prev):
		fail("prev_hash does not match the previous event's hash")
	default:
		h, err := Hash(v.prev, l.Fields)
		if err != nil {
			v.err = err
			return
		}
		if !bytes.Equal(h, l.Hash) {
			fail("hash does not match the event's contents (the row was changed)")
		}
	}
	v.prev = l.Hash
	v.want++
}

// End checks the chain's end against its recorded head (nil: none was
// found) and returns the first problem: the seq it is at and what it is, or
// ok. err is a failure to compute, not a finding.
func (v *Verifier) End(head *Head) (seq int64, problem string, ok bool, err error) {
	if v.err != nil {
		return 0, "", false, v.err
	}
	if v.problem == "" {
		last := v.want - 1
		switch {
		case head == nil:
			v.problem, v.at = "no recorded head for this chain (the head was removed)", last
		case head.Seq > last:
			v.problem, v.at = fmt.Sprintf("chain ends at seq %d but its recorded head is seq %d (the last events were removed)", last, head.Seq), last
		case head.Seq < last:
			v.problem, v.at = fmt.Sprintf("chain runs to seq %d past its recorded head at seq %d (events were added outside an append)", last, head.Seq), head.Seq+1
		case !bytes.Equal(head.Hash, v.prev):
			v.problem, v.at = "the recorded head's hash does not match the last event's", last
		}
	}
	return v.at, v.problem, v.problem == "", nil
}

// Events is how many links were added.
func (v *Verifier) Events() int64 { return v.seen }
