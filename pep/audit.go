package pep

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/gowebpki/jcs"
	"github.com/jackc/pgx/v5"

	"github.com/omcp/arap/internal/chain"
)

// The enforcement point's own audit trail (pep.audit_events): what it did
// with each approval task, written in the transaction that did it (the
// claim's compare-and-set, the finish, the denial, the cancel), so the
// record and the change commit together or not at all. One hash chain per
// task (the chain is the task id), built as internal/chain describes; each
// chain's head is kept in pep.audit_heads, updated in the same statement.
// VerifyAudit checks it all; `arapctl audit verify --pep` runs it.
//
// Audit event kinds: the claim, the claimed run's outcome, and how a task
// ended without running.
const (
	// AuditClaimed: the execution claim was taken; the tool runs at most
	// once, now. Data: generation, tool, args_digest, principal,
	// backend_request_id, approval_id, evaluation_id (the re-evaluation
	// that used the approval), approved_until, exec_deadline,
	// tool_digest, upstream, upstream_tool (the definition that runs).
	AuditClaimed = "execution.claimed"
	// AuditCompleted: the claimed run's recorded outcome. Data: generation,
	// disposition (approved-executed or execution-error), result_digest
	// (SHA-256 of the stored CallToolResult's RFC 8785 form).
	AuditCompleted = "execution.completed"
	// AuditOutcomeUnknown: a claimed run whose outcome was never recorded
	// (ended at its execution deadline), or whose upstream's response was
	// lost; it is never run again. Same data.
	AuditOutcomeUnknown = "execution.outcome_unknown"
	// AuditNotRun: a claimed run that certainly did not reach the tool (its
	// upstream was not reached), ended failed; it is never run again.
	// Data: generation, backend_request_id, error.
	AuditNotRun = "execution.not_run"
	// AuditDenied: ended denied-not-executed. Data: generation,
	// backend_request_id, disposition, result_digest, reason.
	AuditDenied = "task.denied"
	// AuditFailed: ended failed before any claim. Data: generation,
	// backend_request_id, error.
	AuditFailed = "task.failed"
	// AuditCancelled: ended cancelled before any claim. Data: generation,
	// backend_request_id, reason.
	AuditCancelled = "task.cancelled"
)

// actorPEP is the actor of what the enforcement point decides itself; a
// client's cancel is the principal's.
const actorPEP = "pep"

// audit appends an event to task id's chain within tx, at time at.
func (g *Gate) audit(ctx context.Context, tx pgx.Tx, id, kind, actor string, at time.Time, data map[string]any) error {
	var h auditHead
	if err := scanAuditHead(tx.QueryRow(ctx, auditHeadSQL, id), &h); err != nil {
		return fmt.Errorf("pep: audit %s: read head: %w", kind, err)
	}
	return g.appendAudit(ctx, tx, h, id, kind, actor, at, data)
}

// auditHead is a chain's last seq and hash as read, locked, before an
// append (zero: the chain has no event yet).
type auditHead struct {
	seq  int64
	hash []byte
}

// auditHeadSQL reads chain $1's head and locks it for the append.
const auditHeadSQL = `SELECT seq, hash FROM pep.audit_heads WHERE chain = $1 FOR UPDATE`

func scanAuditHead(row pgx.Row, h *auditHead) error {
	err := row.Scan(&h.seq, &h.hash)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	return err
}

// queueAuditHead queues on b (sent in a transaction) the read of chain id's
// head into h, locked for an append later in the transaction.
func queueAuditHead(b *pgx.Batch, id string, h *auditHead) {
	b.Queue(auditHeadSQL, id).QueryRow(func(row pgx.Row) error { return scanAuditHead(row, h) })
}

// appendAudit appends the event to chain id after head h, read (and
// locked) earlier in tx.
func (g *Gate) appendAudit(ctx context.Context, tx pgx.Tx, h auditHead, id, kind, actor string, at time.Time, data map[string]any) error {
	b := &pgx.Batch{}
	if err := queueAppendAudit(b, h, id, kind, actor, at, data); err != nil {
		return err
	}
	err := tx.SendBatch(ctx, b).Close()
	if err != nil && refusalOf(err) != refusedChainMoved {
		return fmt.Errorf("pep: audit %s: %w", kind, err)
	}
	return movedChain(kind, id, err)
}

// queueAppendAudit queues on b (sent in a transaction) the event's append
// to chain id after head h, read (and locked) earlier in the transaction.
// The event and the head are one statement; the head moves only from the
// seq read, so a concurrent append fails the transaction
// (refusedChainMoved) rather than fork the chain.
func queueAppendAudit(b *pgx.Batch, h auditHead, id, kind, actor string, at time.Time, data map[string]any) error {
	raw, err := json.Marshal(data)
	if err != nil {
		return fmt.Errorf("pep: audit %s: encode: %w", kind, err)
	}
	at = at.UTC().Truncate(time.Microsecond)
	seq := h.seq + 1
	hash, err := chain.Hash(h.hash, auditFields(id, seq, at, kind, actor, raw))
	if err != nil {
		return err
	}
	b.Queue(`WITH e AS (INSERT INTO pep.audit_events (chain, seq, at, kind, actor, data, prev_hash, hash)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)),
		head AS (INSERT INTO pep.audit_heads (chain, seq, hash) VALUES ($1, $2, $8)
			ON CONFLICT (chain) DO UPDATE SET seq = excluded.seq, hash = excluded.hash WHERE pep.audit_heads.seq = excluded.seq - 1
			RETURNING true)
		SELECT EXISTS (SELECT FROM head) OR pep.refuse($9)`,
		id, seq, at, kind, actor, raw, h.hash, hash, refusedChainMoved)
	return nil
}

// movedChain names the refusal of an append of kind to chain id whose
// head moved (refusedChainMoved), and passes any other error on.
func movedChain(kind, id string, err error) error {
	if refusalOf(err) == refusedChainMoved {
		return fmt.Errorf("pep: audit %s: chain %s moved during the append", kind, id)
	}
	return err
}

// auditFields are every stored field of an event but its hashes: what the
// hash covers.
func auditFields(chainID string, seq int64, at time.Time, kind, actor string, data []byte) map[string]any {
	return map[string]any{"chain": chainID, "seq": seq, "at": chain.Time(at), "kind": kind, "actor": actor, "data": json.RawMessage(data)}
}

// resultDigest is the hex SHA-256 of a result's canonical (RFC 8785) form,
// which an auditor can recompute from the stored task's result.
func resultDigest(raw []byte) (string, error) {
	c, err := jcs.Transform(raw)
	if err != nil {
		return "", fmt.Errorf("pep: result digest: %w", err)
	}
	s := sha256.Sum256(c)
	return hex.EncodeToString(s[:]), nil
}

// AuditRecord is a stored event.
type AuditRecord struct {
	Chain    string          `json:"chain"`
	Seq      int64           `json:"seq"`
	At       time.Time       `json:"at"`
	Kind     string          `json:"kind"`
	Actor    string          `json:"actor"`
	Data     json.RawMessage `json:"data"`
	PrevHash string          `json:"prev_hash,omitempty"`
	Hash     string          `json:"hash"`
}

// AuditBreak is the first problem found in a chain.
type AuditBreak struct {
	Chain   string `json:"chain"`
	Seq     int64  `json:"seq"`
	Problem string `json:"problem"`
}

func (b AuditBreak) String() string {
	return fmt.Sprintf("chain %s: event seq %d: %s", b.Chain, b.Seq, b.Problem)
}

// AuditReport summarizes a verification.
type AuditReport struct {
	Chains int          `json:"chains"`
	Events int          `json:"events"`
	Breaks []AuditBreak `json:"breaks"`
}

// OK reports whether every chain verified.
func (r AuditReport) OK() bool { return len(r.Breaks) == 0 }

// AuditQuerier runs queries; pools and transactions both do.
type AuditQuerier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// VerifyAudit walks every chain of the enforcement point's audit trail
// against its recorded head and reports the first problem of each: a
// changed field, a removed, inserted or reordered event, a rewritten link,
// a removed last event or head.
func VerifyAudit(ctx context.Context, q AuditQuerier) (AuditReport, error) {
	rep := AuditReport{Breaks: []AuditBreak{}}
	var cur string
	var v *chain.Verifier
	var head *chain.Head
	end := func() error {
		if v == nil {
			return nil
		}
		seq, problem, ok, err := v.End(head)
		if err != nil {
			return err
		}
		if !ok {
			rep.Breaks = append(rep.Breaks, AuditBreak{Chain: cur, Seq: seq, Problem: problem})
		}
		return nil
	}
	rows, err := q.Query(ctx, `SELECT e.chain, e.seq, e.at, e.kind, e.actor, e.data::text, e.prev_hash, e.hash, h.seq, h.hash
		FROM pep.audit_events e LEFT JOIN pep.audit_heads h ON h.chain = e.chain ORDER BY e.chain, e.seq`)
	if err != nil {
		return rep, fmt.Errorf("pep: audit verify: %w", err)
	}
	for rows.Next() {
		var r AuditRecord
		var data string
		var prev, hash, headHash []byte
		var headSeq *int64
		if err := rows.Scan(&r.Chain, &r.Seq, &r.At, &r.Kind, &r.Actor, &data, &prev, &hash, &headSeq, &headHash); err != nil {
			rows.Close()
			return rep, fmt.Errorf("pep: audit verify: %w", err)
		}
		if r.Chain != cur || v == nil {
			if err := end(); err != nil {
				rows.Close()
				return rep, err
			}
			cur, v, head = r.Chain, &chain.Verifier{}, nil
			if headSeq != nil {
				head = &chain.Head{Seq: *headSeq, Hash: headHash}
			}
			rep.Chains++
		}
		rep.Events++
		v.Add(chain.Link{Seq: r.Seq, Prev: prev, Hash: hash, Fields: auditFields(r.Chain, r.Seq, r.At, r.Kind, r.Actor, []byte(data))})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return rep, fmt.Errorf("pep: audit verify: %w", err)
	}
	if err := end(); err != nil {
		return rep, err
	}
	// A head whose chain has no event left: the whole chain was removed.
	orphans, err := q.Query(ctx, `SELECT h.chain, h.seq FROM pep.audit_heads h
		WHERE NOT EXISTS (SELECT 1 FROM pep.audit_events e WHERE e.chain = h.chain) ORDER BY h.chain`)
	if err != nil {
		return rep, fmt.Errorf("pep: audit verify: %w", err)
	}
	lost, err := pgx.CollectRows(orphans, func(r pgx.CollectableRow) (AuditBreak, error) {
		var b AuditBreak
		err := r.Scan(&b.Chain, &b.Seq)
		b.Problem = fmt.Sprintf("every event is missing: the recorded head is seq %d", b.Seq)
		return b, err
	})
	if err != nil {
		return rep, fmt.Errorf("pep: audit verify: %w", err)
	}
	rep.Chains += len(lost)
	rep.Breaks = append(rep.Breaks, lost...)
	return rep, nil
}

// AuditChain returns the events of task id's chain in order.
func AuditChain(ctx context.Context, q AuditQuerier, id string) ([]AuditRecord, error) {
	var out []AuditRecord
	err := scanAudit(ctx, q, `WHERE chain = $1 ORDER BY seq`, []any{id}, func(r AuditRecord) error {
		out = append(out, r)
		return nil
	})
	return out, err
}

// ExportAudit writes every event as JSON lines, chain by chain.
func ExportAudit(ctx context.Context, q AuditQuerier, w io.Writer) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	if err := scanAudit(ctx, q, `ORDER BY chain, seq`, nil, func(r AuditRecord) error { return enc.Encode(r) }); err != nil {
		return err
	}
	return bw.Flush()
}

func scanAudit(ctx context.Context, q AuditQuerier, where string, args []any, fn func(AuditRecord) error) error {
	rows, err := q.Query(ctx, `SELECT chain, seq, at, kind, actor, data::text, prev_hash, hash FROM pep.audit_events `+where, args...)
	if err != nil {
		return fmt.Errorf("pep: audit: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var r AuditRecord
		var data string
		var prev, h []byte
		if err := rows.Scan(&r.Chain, &r.Seq, &r.At, &r.Kind, &r.Actor, &data, &prev, &h); err != nil {
			return fmt.Errorf("pep: audit: %w", err)
		}
		r.Data, r.PrevHash, r.Hash = json.RawMessage(data), hex.EncodeToString(prev), hex.EncodeToString(h)
		if err := fn(r); err != nil {
			return err
		}
	}
	return rows.Err()
}
