// Package audit keeps the backend's audit trail as hash chains: one chain per
// access request (its whole life, from submission to the last decision) and a
// "system" chain for administrative events. Each event stores the SHA-256 of
// the previous event's hash and the canonical (RFC 8785) encoding of every
// column but its row id, so a changed, removed or reordered row breaks the
// chain at that point and Verify names it. Each chain's head (its last seq
// and hash) is kept apart, moved by the statement that appends, so events
// removed from a chain's end, which break no link, are found too.
//
// Events are appended inside the transaction that makes the change they
// record: the change and its audit event commit together or not at all.
package audit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"time"

	"github.com/gowebpki/jcs"
	"github.com/jackc/pgx/v5"

	hashchain "github.com/omcp/arap/internal/chain"
)

// SystemChain holds events that belong to no request.
const SystemChain = "system"

// Event is one thing that happened.
type Event struct {
	Chain string    // request id, or SystemChain
	Kind  string    // e.g. "request.submitted"
	Actor string    // who did it: "client:<id>", "user:<name>", "system"
	At    time.Time // when; set by Append if zero
	Data  any       // details; must encode to a JSON object
}

// Record is a stored event.
type Record struct {
	ID       int64           `json:"id"`
	Chain    string          `json:"chain"`
	Seq      int64           `json:"seq"`
	At       time.Time       `json:"at"`
	Kind     string          `json:"kind"`
	Actor    string          `json:"actor"`
	Data     json.RawMessage `json:"data"`
	PrevHash string          `json:"prev_hash,omitempty"`
	Hash     string          `json:"hash"`
}

// Append adds e to the end of its chain within tx.
func Append(ctx context.Context, tx pgx.Tx, e Event) error {
	return AppendMany(ctx, tx, []Event{e})
}

// QueueFirst queues on b the first event of a new chain (seq 1) and the
// chain's head, in one statement. A new chain needs no lock and no head
// read: nobody else can know it yet, and if it exists after all the insert
// fails on (chain, seq) or on the head. It saves a submission two round
// trips.
func QueueFirst(b *pgx.Batch, e Event) error {
	if e.Chain == "" || e.Kind == "" || e.Actor == "" {
		return errors.New("audit: event needs chain, kind and actor")
	}
	if e.At.IsZero() {
		e.At = time.Now()
	}
	e.At = e.At.UTC().Truncate(time.Microsecond)
	data := []byte("{}")
	if e.Data != nil {
		var err error
		if data, err = json.Marshal(e.Data); err != nil {
			return fmt.Errorf("audit: encode %s: %w", e.Kind, err)
		}
	}
	h, err := linkHash(nil, e.Chain, 1, e.At, e.Kind, e.Actor, data)
	if err != nil {
		return err
	}
	b.Queue(`WITH e AS (INSERT INTO arap.audit_events (chain, seq, at, kind, actor, data, prev_hash, hash)
		VALUES ($1, 1, $2, $3, $4, $5, NULL, $6) RETURNING chain, seq, hash)
		INSERT INTO arap.audit_heads (chain, seq, hash) SELECT chain, seq, hash FROM e`,
		e.Chain, e.At, e.Kind, e.Actor, data, h)
	return nil
}

// AppendMany adds events to the ends of their chains within tx in two round
// trips, however many events there are: lock the chains (in a fixed order,
// so two batches cannot deadlock on each other) and read their heads; then
// insert the events and move the heads. Events of one chain are appended in
// the order given.
func AppendMany(ctx context.Context, tx pgx.Tx, events []Event) error {
	if len(events) == 0 {
		return nil
	}
	type head struct {
		seq  int64
		hash []byte
	}
	heads := map[string]*head{}
	var chains []string
	var locks []int64
	for _, e := range events {
		if e.Chain == "" || e.Kind == "" || e.Actor == "" {
			return errors.New("audit: event needs chain, kind and actor")
		}
		if _, ok := heads[e.Chain]; !ok {
			heads[e.Chain] = &head{}
			chains = append(chains, e.Chain)
			locks = append(locks, chainLock(e.Chain))
		}
	}
	// One round trip: the read runs after the locks are held, and (read
	// committed) sees every append committed before.
	b := &pgx.Batch{}
	b.Queue(`SELECT pg_advisory_xact_lock(l) FROM (SELECT unnest($1::bigint[]) AS l ORDER BY 1) locks`, locks)
	b.Queue(`SELECT chain, seq, hash FROM arap.audit_heads WHERE chain = ANY($1)`, chains)
	res := tx.SendBatch(ctx, b)
	if _, err := res.Exec(); err != nil {
		res.Close()
		return fmt.Errorf("audit: lock chains: %w", err)
	}
	rows, err := res.Query()
	if err != nil {
		res.Close()
		return fmt.Errorf("audit: read chain heads: %w", err)
	}
	for rows.Next() {
		var c string
		var h head
		if err := rows.Scan(&c, &h.seq, &h.hash); err != nil {
			rows.Close()
			res.Close()
			return fmt.Errorf("audit: read chain heads: %w", err)
		}
		*heads[c] = h
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		res.Close()
		return fmt.Errorf("audit: read chain heads: %w", err)
	}
	if err := res.Close(); err != nil {
		return fmt.Errorf("audit: read chain heads: %w", err)
	}
	n := len(events)
	var (
		cs, kinds, actors []string
		seqs              = make([]int64, 0, n)
		ats               = make([]time.Time, 0, n)
		datas             = make([]string, 0, n)
		prevs, hashes     = make([][]byte, 0, n), make([][]byte, 0, n)
	)
	for _, e := range events {
		if e.At.IsZero() {
			e.At = time.Now()
		}
		e.At = e.At.UTC().Truncate(time.Microsecond)
		data := []byte("{}")
		if e.Data != nil {
			if data, err = json.Marshal(e.Data); err != nil {
				return fmt.Errorf("audit: encode %s: %w", e.Kind, err)
			}
		}
		h := heads[e.Chain]
		seq := h.seq + 1
		sum, err := linkHash(h.hash, e.Chain, seq, e.At, e.Kind, e.Actor, data)
		if err != nil {
			return err
		}
		cs, seqs, ats, kinds, actors = append(cs, e.Chain), append(seqs, seq), append(ats, e.At), append(kinds, e.Kind), append(actors, e.Actor)
		datas, prevs, hashes = append(datas, string(data)), append(prevs, h.hash), append(hashes, sum)
		h.seq, h.hash = seq, sum
	}
	// The events and the new heads in one statement. A head moves only
	// forward; one that does not (it changed under the lock) fails the
	// append rather than fork the chain.
	tag, err := tx.Exec(ctx, `WITH e AS (INSERT INTO arap.audit_events (chain, seq, at, kind, actor, data, prev_hash, hash)
		SELECT * FROM unnest($1::text[], $2::bigint[], $3::timestamptz[], $4::text[], $5::text[], $6::jsonb[], $7::bytea[], $8::bytea[])
		RETURNING chain, seq, hash)
		INSERT INTO arap.audit_heads AS h (chain, seq, hash)
		SELECT DISTINCT ON (chain) chain, seq, hash FROM e ORDER BY chain, seq DESC
		ON CONFLICT (chain) DO UPDATE SET seq = excluded.seq, hash = excluded.hash WHERE h.seq < excluded.seq`,
		cs, seqs, ats, kinds, actors, datas, prevs, hashes)
	if err != nil {
		return fmt.Errorf("audit: insert %d events: %w", n, err)
	}
	if int(tag.RowsAffected()) != len(chains) {
		return fmt.Errorf("audit: insert %d events: %d of %d chain heads moved", n, tag.RowsAffected(), len(chains))
	}
	return nil
}

// LockChain takes, within tx, the lock appends to chain take, so whatever
// tx does to the chain is not interleaved with an append (a test that
// rewrites a chain, as an attacker with database access would).
func LockChain(ctx context.Context, tx pgx.Tx, chain string) error {
	_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, chainLock(chain))
	return err
}

func chainLock(chain string) int64 {
	f := fnv.New64a()
	_, _ = f.Write([]byte("audit:" + chain))
	return int64(f.Sum64())
}

// linkHash is SHA-256(prev || JCS({chain, seq, at, kind, actor, data})).
func linkHash(prev []byte, chain string, seq int64, at time.Time, kind, actor string, data []byte) ([]byte, error) {
	return hashchain.Hash(prev, map[string]any{
		"chain": chain,
		"seq":   seq,
		"at":    at.UTC().Format(time.RFC3339Nano),
		"kind":  kind,
		"actor": actor,
		"data":  json.RawMessage(data),
	})
}

// Querier runs queries; *pgxpool.Pool and pgx.Tx both are.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Chain returns the events of one chain in order.
func Chain(ctx context.Context, q Querier, chain string) ([]Record, error) {
	var out []Record
	err := scan(ctx, q, `WHERE chain = $1 ORDER BY seq`, []any{chain}, func(r Record) error {
		out = append(out, r)
		return nil
	})
	return out, err
}

// Kinds calls fn with every event of the given kinds, chain by chain in
// order (for checks over the log, such as the passkey signatures of
// decisions).
func Kinds(ctx context.Context, q Querier, kinds []string, fn func(Record) error) error {
	return scan(ctx, q, `WHERE kind = ANY($1) ORDER BY chain, seq`, []any{kinds}, fn)
}

func scan(ctx context.Context, q Querier, where string, args []any, fn func(Record) error) error {
	rows, err := q.Query(ctx, `SELECT id, chain, seq, at, kind, actor, data::text, prev_hash, hash FROM arap.audit_events `+where, args...)
	if err != nil {
		return fmt.Errorf("audit: query: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var r Record
		var data string
		var prev, h []byte
		if err := rows.Scan(&r.ID, &r.Chain, &r.Seq, &r.At, &r.Kind, &r.Actor, &data, &prev, &h); err != nil {
			return fmt.Errorf("audit: scan: %w", err)
		}
		r.Data = json.RawMessage(data)
		r.PrevHash, r.Hash = hex.EncodeToString(prev), hex.EncodeToString(h)
		if err := fn(r); err != nil {
			return err
		}
	}
	return rows.Err()
}

// Break is the first broken link found in a chain.
type Break struct {
	Chain   string `json:"chain"`
	Seq     int64  `json:"seq"`
	EventID int64  `json:"event_id,omitempty"` // 0 when the event is missing
	Problem string `json:"problem"`
}

func (b Break) String() string {
	if b.EventID == 0 {
		return fmt.Sprintf("chain %s: seq %d: %s", b.Chain, b.Seq, b.Problem)
	}
	return fmt.Sprintf("chain %s: event seq %d (id %d): %s", b.Chain, b.Seq, b.EventID, b.Problem)
}

// Report summarizes a verification.
type Report struct {
	Chains int     `json:"chains"`
	Events int     `json:"events"`
	Breaks []Break `json:"breaks"`
}

// OK reports whether every chain verified.
func (r Report) OK() bool { return len(r.Breaks) == 0 }

// Verify walks every chain and reports the first break of each: a link whose
// hash does not match the event's contents or the event before it, a gap
// in the sequence, or a chain that does not end where its head says (events
// removed from its end, or added past it), including a head whose events
// are all gone. It reads events and heads in one statement, so one snapshot:
// appends committing meanwhile are either seen whole or not at all.
func Verify(ctx context.Context, q Querier) (Report, error) {
	rep := Report{Breaks: []Break{}}
	rows, err := q.Query(ctx, `SELECT false AS head, id, chain, seq, at, kind, actor, data::text, prev_hash, hash FROM arap.audit_events
		UNION ALL
		SELECT true, 0, chain, seq, 'epoch'::timestamptz, '', '', '{}', NULL, hash FROM arap.audit_heads
		ORDER BY chain, seq, head`)
	if err != nil {
		return rep, fmt.Errorf("audit: query: %w", err)
	}
	defer rows.Close()
	var (
		c      chainState
		inside bool
	)
	for rows.Next() {
		var r Record
		var isHead bool
		var data string
		var prev, h []byte
		if err := rows.Scan(&isHead, &r.ID, &r.Chain, &r.Seq, &r.At, &r.Kind, &r.Actor, &data, &prev, &h); err != nil {
			return rep, fmt.Errorf("audit: scan: %w", err)
		}
		if !inside || r.Chain != c.chain {
			if inside {
				c.end(&rep)
			}
			c, inside = chainState{chain: r.Chain, want: 1}, true
			rep.Chains++
		}
		if isHead {
			c.head, c.headSeq = h, r.Seq
			continue
		}
		rep.Events++
		r.Data = json.RawMessage(data)
		if err := c.event(&rep, r, prev, h); err != nil {
			return rep, err
		}
	}
	if err := rows.Err(); err != nil {
		return rep, fmt.Errorf("audit: query: %w", err)
	}
	if inside {
		c.end(&rep)
	}
	return rep, nil
}

// chainState is Verify's walk of one chain.
type chainState struct {
	chain   string
	want    int64  // the next seq expected
	prev    []byte // the hash of the last event read
	lastID  int64
	broken  bool
	head    []byte // the recorded head's hash, nil if none was read
	headSeq int64
}

func (c *chainState) fail(rep *Report, seq, id int64, problem string) {
	rep.Breaks = append(rep.Breaks, Break{Chain: c.chain, Seq: seq, EventID: id, Problem: problem})
	c.broken = true
}

func (c *chainState) event(rep *Report, r Record, storedPrev, stored []byte) error {
	defer func() { c.prev, c.lastID = stored, r.ID; c.want++ }()
	if c.broken {
		return nil
	}
	switch {
	case r.Seq != c.want:
		c.fail(rep, r.Seq, r.ID, fmt.Sprintf("sequence gap: expected seq %d (an event was removed or reordered)", c.want))
	case !bytes.Equal(storedPrev, c.prev):
		c.fail(rep, r.Seq, r.ID, "prev_hash does not match the previous event's hash")
	default:
		canonData, err := jcs.Transform(r.Data)
		if err != nil {
			c.fail(rep, r.Seq, r.ID, "data is not valid JSON: "+err.Error())
			return nil
		}
		h, err := linkHash(c.prev, r.Chain, r.Seq, r.At, r.Kind, r.Actor, canonData)
		if err != nil {
			return err
		}
		if !bytes.Equal(h, stored) {
			c.fail(rep, r.Seq, r.ID, "hash does not match the event's contents (the row was changed)")
		}
	}
	return nil
}

// end checks where the chain stops against its head.
func (c *chainState) end(rep *Report) {
	last := c.want - 1
	switch {
	case c.broken:
	case last == 0:
		c.fail(rep, c.headSeq, 0, fmt.Sprintf("the head records seq %d but the chain has no events: they were removed", c.headSeq))
	case c.head == nil:
		c.fail(rep, last, c.lastID, "the chain has no head: it was removed, or these events were written around audit.Append")
	case c.headSeq > last:
		c.fail(rep, last+1, 0, fmt.Sprintf("missing: the chain ends at seq %d but its head records seq %d (events were removed from its end)", last, c.headSeq))
	case c.headSeq < last:
		c.fail(rep, c.headSeq+1, 0, fmt.Sprintf("the chain goes on past its head (seq %d) to seq %d: events were added around audit.Append", c.headSeq, last))
	case !bytes.Equal(c.head, c.prev):
		c.fail(rep, last, c.lastID, "the last event is not the one the head records")
	}
}

// Export writes every event as JSON lines, chain by chain.
func Export(ctx context.Context, q Querier, w io.Writer) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	err := scan(ctx, q, `ORDER BY chain, seq`, nil, func(r Record) error { return enc.Encode(r) })
	if err != nil {
		return err
	}
	return bw.Flush()
}
