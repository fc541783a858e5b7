// Package audit keeps the backend's audit trail as hash chains: one chain per
// access request (its whole life, from submission to the last decision) and a
// "system" chain for administrative events. Each event stores the SHA-256 of
// the previous event's hash and its own canonical (RFC 8785) encoding, so a
// changed, removed or reordered row breaks the chain at that point and Verify
// names it.
//
// Events are appended inside the transaction that makes the change they
// record: the change and its audit event commit together or not at all.
package audit

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"time"

	"github.com/gowebpki/jcs"
	"github.com/jackc/pgx/v5"

	"github.com/omcp/arap/authzen"
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
	if e.Chain == "" || e.Kind == "" || e.Actor == "" {
		return errors.New("audit: event needs chain, kind and actor")
	}
	if e.At.IsZero() {
		e.At = time.Now()
	}
	// PostgreSQL keeps microseconds; hash what will be read back.
	e.At = e.At.UTC().Truncate(time.Microsecond)
	data, err := json.Marshal(e.Data)
	if err != nil {
		return fmt.Errorf("audit: encode %s: %w", e.Kind, err)
	}
	if e.Data == nil {
		data = []byte("{}")
	}
	// Appends to one chain are serialized for the rest of the transaction.
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", chainLock(e.Chain)); err != nil {
		return fmt.Errorf("audit: lock chain: %w", err)
	}
	var seq int64
	var prev []byte
	err = tx.QueryRow(ctx, `SELECT seq, hash FROM arap.audit_events WHERE chain = $1 ORDER BY seq DESC LIMIT 1`, e.Chain).Scan(&seq, &prev)
	if errors.Is(err, pgx.ErrNoRows) {
		seq, prev = 0, nil
	} else if err != nil {
		return fmt.Errorf("audit: read chain head: %w", err)
	}
	seq++
	h, err := linkHash(prev, e.Chain, seq, e.At, e.Kind, e.Actor, data)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO arap.audit_events (chain, seq, at, kind, actor, data, prev_hash, hash)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, e.Chain, seq, e.At, e.Kind, e.Actor, data, prev, h); err != nil {
		return fmt.Errorf("audit: insert %s: %w", e.Kind, err)
	}
	return nil
}

// QueueFirst queues on b the first event of a new chain (seq 1). A new
// chain needs no lock and no head: nobody else can know it yet, and if it
// exists after all the insert fails on (chain, seq). It saves a submission
// two round trips.
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
	b.Queue(`INSERT INTO arap.audit_events (chain, seq, at, kind, actor, data, prev_hash, hash) VALUES ($1, 1, $2, $3, $4, $5, NULL, $6)`,
		e.Chain, e.At, e.Kind, e.Actor, data, h)
	return nil
}

// AppendMany adds events to the ends of their chains within tx in three
// statements, however many events there are: lock the chains (in a fixed
// order, so two batches cannot deadlock on each other), read their heads,
// insert. Events of one chain are appended in the order given.
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
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(l) FROM (SELECT unnest($1::bigint[]) AS l ORDER BY 1) locks`, locks); err != nil {
		return fmt.Errorf("audit: lock chains: %w", err)
	}
	rows, err := tx.Query(ctx, `SELECT DISTINCT ON (chain) chain, seq, hash FROM arap.audit_events
		WHERE chain = ANY($1) ORDER BY chain, seq DESC`, chains)
	if err != nil {
		return fmt.Errorf("audit: read chain heads: %w", err)
	}
	for rows.Next() {
		var c string
		var h head
		if err := rows.Scan(&c, &h.seq, &h.hash); err != nil {
			rows.Close()
			return fmt.Errorf("audit: read chain heads: %w", err)
		}
		*heads[c] = h
	}
	rows.Close()
	if err := rows.Err(); err != nil {
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
	if _, err := tx.Exec(ctx, `INSERT INTO arap.audit_events (chain, seq, at, kind, actor, data, prev_hash, hash)
		SELECT * FROM unnest($1::text[], $2::bigint[], $3::timestamptz[], $4::text[], $5::text[], $6::jsonb[], $7::bytea[], $8::bytea[])`,
		cs, seqs, ats, kinds, actors, datas, prevs, hashes); err != nil {
		return fmt.Errorf("audit: insert %d events: %w", n, err)
	}
	return nil
}

func chainLock(chain string) int64 {
	f := fnv.New64a()
	_, _ = f.Write([]byte("audit:" + chain))
	return int64(f.Sum64())
}

// linkHash is SHA-256(prev || JCS({chain, seq, at, kind, actor, data})).
func linkHash(prev []byte, chain string, seq int64, at time.Time, kind, actor string, data []byte) ([]byte, error) {
	body, err := authzen.Canonical(map[string]any{
		"chain": chain,
		"seq":   seq,
		"at":    at.UTC().Format(time.RFC3339Nano),
		"kind":  kind,
		"actor": actor,
		"data":  json.RawMessage(data),
	})
	if err != nil {
		return nil, fmt.Errorf("audit: canonical form: %w", err)
	}
	h := sha256.New()
	h.Write(prev)
	h.Write(body)
	return h.Sum(nil), nil
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
	EventID int64  `json:"event_id"`
	Problem string `json:"problem"`
}

func (b Break) String() string {
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

// Verify walks every chain and reports the first broken link of each.
func Verify(ctx context.Context, q Querier) (Report, error) {
	rep := Report{Breaks: []Break{}}
	var cur string
	var prev []byte
	var want int64
	broken := false
	err := scan(ctx, q, `ORDER BY chain, seq`, nil, func(r Record) error {
		if r.Chain != cur || rep.Events == 0 {
			cur, prev, want, broken = r.Chain, nil, 1, false
			rep.Chains++
		}
		rep.Events++
		if broken {
			return nil
		}
		fail := func(problem string) {
			rep.Breaks = append(rep.Breaks, Break{Chain: r.Chain, Seq: r.Seq, EventID: r.ID, Problem: problem})
			broken = true
		}
		storedPrev, _ := hex.DecodeString(r.PrevHash)
		stored, _ := hex.DecodeString(r.Hash)
		switch {
		case r.Seq != want:
			fail(fmt.Sprintf("sequence gap: expected seq %d (an event was removed or reordered)", want))
		case !bytes.Equal(storedPrev, prev):
			fail("prev_hash does not match the previous event's hash")
		default:
			canonData, err := jcs.Transform(r.Data)
			if err != nil {
				fail("data is not valid JSON: " + err.Error())
				break
			}
			h, err := linkHash(prev, r.Chain, r.Seq, r.At, r.Kind, r.Actor, canonData)
			if err != nil {
				return err
			}
			if !bytes.Equal(h, stored) {
				fail("hash does not match the event's contents (the row was changed)")
			}
		}
		prev = stored
		want++
		return nil
	})
	return rep, err
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
