package audit

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The stream (GET /v1/audit) serves every event once, in an order that no
// later commit can go back on: by the writing transaction's id, then the
// event's id, and only events of transactions older than every transaction
// still in flight (the snapshot's xmin). Any event that becomes visible
// later belongs to a transaction at or past that xmin, so it sorts after
// everything served so far, and a cursor never passes it. The price is
// latency: a long-running transaction holds the stream back until it ends.
//
// Events of one chain appear in the stream in commit order, which is
// their seq order except in one case: a transaction that took its id before
// waiting for the chain's lock may follow the one it waited for. A reader
// verifies a chain by seq (VerifyRecords sorts).

// Limits of one page.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// ErrBadCursor means a cursor this server did not issue.
var ErrBadCursor = errors.New("audit: the cursor is not one this server issued")

// Cursor is a position in the stream, opaque to clients.
type Cursor struct {
	txid  uint64
	id    int64
	since time.Time // zero: from the beginning
}

// Start is the position before the first event at or after since (zero:
// before every event).
func Start(since time.Time) Cursor { return Cursor{since: since.UTC().Truncate(time.Microsecond)} }

const cursorPrefix = "a1."

// String encodes the cursor.
func (c Cursor) String() string {
	s := strconv.FormatUint(c.txid, 10) + "." + strconv.FormatInt(c.id, 10) + "."
	if !c.since.IsZero() {
		s += strconv.FormatInt(c.since.UnixMicro(), 10)
	}
	return cursorPrefix + base64.RawURLEncoding.EncodeToString([]byte(s))
}

// ParseCursor decodes a cursor String made.
func ParseCursor(s string) (Cursor, error) {
	raw, ok := strings.CutPrefix(s, cursorPrefix)
	if !ok || len(s) > 200 {
		return Cursor{}, ErrBadCursor
	}
	b, err := base64.RawURLEncoding.DecodeString(raw)
	if err != nil {
		return Cursor{}, ErrBadCursor
	}
	parts := strings.Split(string(b), ".")
	if len(parts) != 3 {
		return Cursor{}, ErrBadCursor
	}
	var c Cursor
	if c.txid, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return Cursor{}, ErrBadCursor
	}
	if c.id, err = strconv.ParseInt(parts[1], 10, 64); err != nil || c.id < 0 {
		return Cursor{}, ErrBadCursor
	}
	if parts[2] != "" {
		us, err := strconv.ParseInt(parts[2], 10, 64)
		if err != nil {
			return Cursor{}, ErrBadCursor
		}
		c.since = time.UnixMicro(us).UTC()
	}
	return c, nil
}

// Page is one page of the stream.
type Page struct {
	Events []Record `json:"events"`
	// Next is where the following page starts: the cursor to ask with next
	// time, also when Events is empty (then it is the cursor asked with).
	Next string `json:"next_cursor"`
}

// Read returns up to limit events after c in stream order (limit is
// clamped to 1..MaxPageSize).
func Read(ctx context.Context, q Querier, c Cursor, limit int) (Page, error) {
	limit = max(1, min(limit, MaxPageSize))
	var since *time.Time
	if !c.since.IsZero() {
		since = &c.since
	}
	// e.txid, qualified: ORDER BY txid would sort by the text output column
	// of that name (and put 1000 before 999).
	rows, err := q.Query(ctx, `SELECT e.id, e.chain, e.seq, e.at, e.kind, e.actor, e.data::text, e.prev_hash, e.hash, e.txid::text AS position
		FROM arap.audit_events e
		WHERE (e.txid, e.id) > ($1::text::xid8, $2::bigint)
		  AND e.txid < pg_snapshot_xmin(pg_current_snapshot())
		  AND ($3::timestamptz IS NULL OR e.at >= $3)
		ORDER BY e.txid, e.id LIMIT $4`, strconv.FormatUint(c.txid, 10), c.id, since, limit)
	if err != nil {
		return Page{}, fmt.Errorf("audit: read stream: %w", err)
	}
	defer rows.Close()
	p := Page{Events: []Record{}}
	for rows.Next() {
		var r Record
		var data, txid string
		var prev, h []byte
		if err := rows.Scan(&r.ID, &r.Chain, &r.Seq, &r.At, &r.Kind, &r.Actor, &data, &prev, &h, &txid); err != nil {
			return Page{}, fmt.Errorf("audit: read stream: %w", err)
		}
		r.Data = json.RawMessage(data)
		r.PrevHash, r.Hash = hex.EncodeToString(prev), hex.EncodeToString(h)
		if c.txid, err = strconv.ParseUint(txid, 10, 64); err != nil {
			return Page{}, fmt.Errorf("audit: read stream: txid %q: %w", txid, err)
		}
		c.id = r.ID
		p.Events = append(p.Events, r)
	}
	if err := rows.Err(); err != nil {
		return Page{}, fmt.Errorf("audit: read stream: %w", err)
	}
	p.Next = c.String()
	return p, nil
}

// VerifyRecords checks the hash links of exported events (such as the
// stream's), chain by chain in seq order: each event's hash must match its
// contents and the event before it, with no seq missing. A chain whose
// first event here is not its first (an export that starts at a time)
// is checked from that event on, taking its prev_hash as given. Unlike
// Verify it cannot see events removed from a chain's end: that needs the
// heads, in the database.
func VerifyRecords(records []Record) Report {
	rep := Report{Breaks: []Break{}}
	byChain := map[string][]Record{}
	var chains []string
	for _, r := range records {
		if _, ok := byChain[r.Chain]; !ok {
			chains = append(chains, r.Chain)
		}
		byChain[r.Chain] = append(byChain[r.Chain], r)
	}
	slices.Sort(chains)
	for _, name := range chains {
		rs := byChain[name]
		slices.SortFunc(rs, func(a, b Record) int { return int(a.Seq - b.Seq) })
		rep.Chains++
		c := chainState{chain: name, want: rs[0].Seq}
		if rs[0].Seq > 1 {
			c.prev, _ = hex.DecodeString(rs[0].PrevHash)
		}
		for _, r := range rs {
			rep.Events++
			prev, err1 := hex.DecodeString(r.PrevHash)
			h, err2 := hex.DecodeString(r.Hash)
			if err1 != nil || err2 != nil {
				c.fail(&rep, r.Seq, r.ID, "hash or prev_hash is not hex")
				continue
			}
			if len(prev) == 0 {
				prev = nil
			}
			if err := c.event(&rep, r, prev, h); err != nil {
				c.fail(&rep, r.Seq, r.ID, err.Error())
			}
		}
	}
	return rep
}
