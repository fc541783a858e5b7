package pep_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"
	"time"

	"github.com/gowebpki/jcs"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/chain"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/pep"
)

// TestPEPAuditTrail: every way an approval task ends is recorded in the
// front-end's own hash-chained trail, in the transaction that ended it: the
// claim with everything it was for (tool, arguments digest, principal,
// backend request, approval, approved_until), the run's outcome with the
// digest of the stored result, an outcome-unknown reap, a denial, a cancel.
// The trail verifies; any change to any stored field of an event, a removed,
// reordered or added event, and a removed or changed head is found, at the
// chain and event where it happened.
func TestPEPAuditTrail(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	release := make(chan struct{})
	p := newPEP(t, pepOptions{execTimeout: time.Minute,
		run: func(next func(context.Context, pep.Invocation) (pep.Output, error)) func(context.Context, pep.Invocation) (pep.Output, error) {
			return func(ctx context.Context, x pep.Invocation) (pep.Output, error) {
				if x.Args["to"] == "acct-50013" {
					<-release // a run that outlives its execution deadline
				}
				return next(ctx, x)
			}
		}})

	// Ran.
	ran := p.transfer(t, 50011)
	req := p.request(t, ran)
	p.approve(t, req, time.Time{})
	ap := p.approval(t, req)
	p.advance(t, ran)
	require.Equal(t, pep.ApprovedExecuted, disposition(t, p.task(t, ran)))
	recs, err := pep.AuditChain(ctx, p.db, ran)
	require.NoError(t, err)
	require.Len(t, recs, 2)
	claim, done := recs[0], recs[1]
	require.Equal(t, pep.AuditClaimed, claim.Kind)
	require.Equal(t, "pep", claim.Actor)
	var cd map[string]any
	require.NoError(t, json.Unmarshal(claim.Data, &cd))
	var digest, principal, toolDigest string
	require.NoError(t, p.db.QueryRow(ctx, `SELECT args_digest, principal, tool_digest FROM pep.approval_tasks WHERE task_id = $1`, ran).Scan(&digest, &principal, &toolDigest))
	require.Equal(t, map[string]any{"generation": 1.0, "tool": "wire_transfer", "args_digest": digest, "principal": "user:alice|agent:demo",
		"backend_request_id": req, "approval_id": ap.ID, "evaluation_id": cd["evaluation_id"], "approved_until": ap.ApprovedUntil.UTC().Format(time.RFC3339Nano),
		"exec_deadline": cd["exec_deadline"], "tool_digest": toolDigest, "upstream": "demo", "upstream_tool": "wire_transfer"}, cd)
	require.Equal(t, principal, cd["principal"])
	// The claim names the re-evaluation that used the approval, the one the
	// backend cites when it refuses to revoke it.
	code, refused := p.backendAPI(t, dev.ITSMToken, "POST", "/v1/approvals/"+ap.ID+"/revoke", map[string]any{"reason": "after the run"})
	require.Equal(t, 409, code, "%v", refused)
	require.NotEmpty(t, cd["evaluation_id"])
	require.Equal(t, cd["evaluation_id"], refused["evaluation_id"])
	require.Equal(t, pep.AuditCompleted, done.Kind)
	var dd map[string]any
	require.NoError(t, json.Unmarshal(done.Data, &dd))
	require.Equal(t, pep.ApprovedExecuted, dd["disposition"])
	var stored string
	require.NoError(t, p.db.QueryRow(ctx, `SELECT result::text FROM pep.tasks WHERE id = $1`, ran).Scan(&stored))
	canon, err := jcs.Transform([]byte(stored))
	require.NoError(t, err)
	sum := sha256.Sum256(canon)
	require.Equal(t, hex.EncodeToString(sum[:]), dd["result_digest"], "an auditor can recompute the result digest from the stored task")
	require.Equal(t, claim.Hash, done.PrevHash)
	require.Empty(t, claim.PrevHash)

	// Denied at the backend.
	denied := p.transfer(t, 50012)
	code, out := p.backendAPI(t, dev.ITSMToken, "POST", "/v1/requests/"+p.request(t, denied)+"/decisions", map[string]any{"decision": "deny", "reason": "no"})
	require.Equal(t, 200, code, "%v", out)
	p.advance(t, denied)
	require.Equal(t, []string{pep.AuditDenied}, p.trail(t, denied))

	// Claimed, and the run outlives its execution deadline: reaped as
	// outcome-unknown; the run's late end records nothing more.
	unknown := p.transfer(t, 50013)
	p.approve(t, p.request(t, unknown), time.Time{})
	late := make(chan error, 1)
	go func() { _, err := p.gate.Advance(context.Background(), unknown); late <- err }()
	require.Eventually(t, func() bool {
		var n int
		_ = p.db.QueryRow(ctx, `SELECT count(*) FROM pep.audit_events WHERE chain = $1 AND kind = $2`, unknown, pep.AuditClaimed).Scan(&n)
		return n == 1
	}, time.Minute, 20*time.Millisecond, "claimed")
	var atDeadline bool
	require.NoError(t, p.db.QueryRow(ctx, `SELECT look_at = exec_deadline FROM pep.approval_tasks WHERE task_id = $1`, unknown).Scan(&atDeadline))
	require.True(t, atDeadline, "the claim schedules its look at its execution deadline")
	p.offset.Store(int64(2 * time.Minute))
	n, err := p.gate.LookDue(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the claim's look at its execution deadline")
	p.offset.Store(0)
	require.Equal(t, pep.OutcomeUnknown, disposition(t, p.task(t, unknown)))
	close(release)
	require.NoError(t, wait(t, late, "the late run to end"))
	require.Equal(t, 1, p.ledger(t, unknown), "it did run, late")
	require.Equal(t, []string{pep.AuditClaimed, pep.AuditOutcomeUnknown}, p.trail(t, unknown), "its late end changes nothing")

	// Cancelled by its caller.
	cancelled := p.transfer(t, 50014)
	require.NoError(t, p.alice.Cancel(ctx, cancelled))
	recs, err = pep.AuditChain(ctx, p.db, cancelled)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	require.Equal(t, pep.AuditCancelled, recs[0].Kind)
	require.Equal(t, principal, recs[0].Actor, "the caller cancelled it")

	rep := p.requireIntact(t)
	require.Equal(t, 4, rep.Chains)
	require.Equal(t, 6, rep.Events)

	// A forged third event on the ran chain, correctly linked, appended
	// without moving the head.
	at := time.Now().UTC().Truncate(time.Microsecond)
	prev, err := hex.DecodeString(done.Hash)
	require.NoError(t, err)
	forged, err := chain.Hash(prev, map[string]any{"chain": ran, "seq": 3, "at": chain.Time(at), "kind": pep.AuditCompleted, "actor": "pep",
		"data": json.RawMessage(`{"disposition":"denied-not-executed"}`)})
	require.NoError(t, err)

	for name, tc := range map[string]struct {
		sql     string
		args    []any
		seq     int64
		problem string
	}{
		"chain":               {`UPDATE pep.audit_events SET chain = 'tsk_elsewhere' WHERE chain = $1 AND seq = 2`, nil, 1, "last events were removed"},
		"seq":                 {`UPDATE pep.audit_events SET seq = 3 WHERE chain = $1 AND seq = 2`, nil, 3, "sequence gap"},
		"at":                  {`UPDATE pep.audit_events SET at = at + interval '1 microsecond' WHERE chain = $1 AND seq = 1`, nil, 1, "contents"},
		"kind":                {`UPDATE pep.audit_events SET kind = 'task.denied' WHERE chain = $1 AND seq = 2`, nil, 2, "contents"},
		"actor":               {`UPDATE pep.audit_events SET actor = 'user:mallory|' WHERE chain = $1 AND seq = 1`, nil, 1, "contents"},
		"data":                {`UPDATE pep.audit_events SET data = jsonb_set(data, '{args_digest}', '"00"') WHERE chain = $1 AND seq = 1`, nil, 1, "contents"},
		"data, outcome":       {`UPDATE pep.audit_events SET data = jsonb_set(data, '{disposition}', '"denied-not-executed"') WHERE chain = $1 AND seq = 2`, nil, 2, "contents"},
		"prev_hash":           {`UPDATE pep.audit_events SET prev_hash = '\x00' WHERE chain = $1 AND seq = 2`, nil, 2, "prev_hash"},
		"hash":                {`UPDATE pep.audit_events SET hash = sha256(hash) WHERE chain = $1 AND seq = 2`, nil, 2, "contents"},
		"last event removed":  {`DELETE FROM pep.audit_events WHERE chain = $1 AND seq = 2`, nil, 1, "last events were removed"},
		"first event removed": {`DELETE FROM pep.audit_events WHERE chain = $1 AND seq = 1`, nil, 2, "sequence gap"},
		"reordered": {`UPDATE pep.audit_events SET seq = 100 WHERE chain = $1 AND seq = 1;
			UPDATE pep.audit_events SET seq = 1 WHERE chain = $1 AND seq = 2;
			UPDATE pep.audit_events SET seq = 2 WHERE chain = $1 AND seq = 100`, nil, 1, "prev_hash"},
		"every event removed": {`DELETE FROM pep.audit_events WHERE chain = $1`, nil, 2, "every event is missing"},
		"head removed":        {`DELETE FROM pep.audit_heads WHERE chain = $1`, nil, 2, "no recorded head"},
		"head hash changed":   {`UPDATE pep.audit_heads SET hash = sha256(hash) WHERE chain = $1`, nil, 2, "head's hash"},
		"event appended":      {`INSERT INTO pep.audit_events (chain, seq, at, kind, actor, data, prev_hash, hash) VALUES ($1, 3, $2, $3, 'pep', $4, $5, $6)`, []any{at, pep.AuditCompleted, `{"disposition":"denied-not-executed"}`, prev, forged}, 3, "past its recorded head"},
	} {
		t.Run(name, func(t *testing.T) {
			tx, err := p.db.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			// Several statements: the simple protocol, one at a time.
			if tc.args == nil {
				_, err = tx.Exec(ctx, tc.sql, pgx.QueryExecModeSimpleProtocol, ran)
			} else {
				_, err = tx.Exec(ctx, tc.sql, append([]any{ran}, tc.args...)...)
			}
			require.NoError(t, err)
			rep, err := pep.VerifyAudit(ctx, tx)
			require.NoError(t, err)
			var found []pep.AuditBreak
			for _, b := range rep.Breaks {
				if b.Chain == ran {
					found = append(found, b)
				} else {
					require.Equal(t, "tsk_elsewhere", b.Chain, "only the tampered chain breaks: %v", rep.Breaks)
				}
			}
			require.Len(t, found, 1, "tampering went unnoticed: %v", rep.Breaks)
			require.Equal(t, tc.seq, found[0].Seq, "%v", found[0])
			require.Contains(t, found[0].Problem, tc.problem)
		})
	}
}
