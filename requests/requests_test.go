package requests_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/migrations"
	"github.com/omcp/arap/requests"
)

func TestSubmitCreatesPendingRequestWithAudit(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	res, err := f.svc.Submit(ctx, f.pep, "key-1", f.fresh("wire_transfer", map[string]any{"to": "acct-991", "amount": 50000}))
	require.NoError(t, err)
	r := res.Request
	require.False(t, res.Replayed)
	require.True(t, strings.HasPrefix(r.ID, "arq_"))
	require.Greater(t, len(r.ID), 24, "task ids carry enough entropy")
	require.Equal(t, requests.Pending, r.Status)
	require.Equal(t, "wire_transfer_large", r.Rule)
	require.WithinDuration(t, f.clock.Now().Add(24*time.Hour), r.ExpiresAt, 2*time.Second)

	h := r.Handle(f.svc.StatusEndpoint(r.ID))
	require.Equal(t, requestsURL+"/"+r.ID, h.Task.StatusEndpoint)
	require.Equal(t, requestsURL+"/"+r.ID+"/cancel", h.Task.Links["cancel"])
	require.Equal(t, "Treasury approval", h.Task.Display["title"])
	require.Nil(t, h.Result)

	// The verified binding_token is not kept (nothing reads it, and it
	// made every request row too large to stay inline).
	var kept bool
	require.NoError(t, f.db.QueryRow(ctx, `SELECT denial ? 'binding_token' FROM arap.requests WHERE id = $1`, r.ID).Scan(&kept))
	require.False(t, kept, "the request keeps no binding_token")

	events, err := audit.Chain(ctx, f.db, r.ID)
	require.NoError(t, err)
	require.Len(t, events, 1)
	require.Equal(t, "request.submitted", events[0].Kind)
	require.Equal(t, "client:pep", events[0].Actor)
	// No job per request: the expiry sweep finds it by its deadline.
	var jobs int
	require.NoError(t, f.db.QueryRow(ctx, `SELECT count(*) FROM river.river_job WHERE args->>'request_id' = $1`, r.ID).Scan(&jobs))
	require.Zero(t, jobs)
}

func TestIdempotency(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	req := toolCall("wire_transfer", map[string]any{"to": "acct-991", "amount": 50000})
	d, hint := f.deny(f.pep, req)
	body := submission(req, d, hint)
	raw := mustJSON(t, body)

	first, err := f.svc.Submit(ctx, f.pep, "k", raw)
	require.NoError(t, err)

	// Same key, same bytes: the same handle, even though the token's jti repeats.
	again, err := f.svc.Submit(ctx, f.pep, "k", raw)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, first.Request.ID, again.Request.ID)

	// Same key, an equivalent body (reordered, re-spaced): still the same.
	equivalent := []byte(" {\n\"denial\": " + string(mustJSON(t, body["denial"])) + ", \"subject\": " + string(mustJSON(t, body["subject"])) +
		", \"action\":" + string(mustJSON(t, body["action"])) + ",\"resource\":" + string(mustJSON(t, body["resource"])) +
		",\"context\":" + string(mustJSON(t, body["context"])) + "}\n")
	again, err = f.svc.Submit(ctx, f.pep, "\"k\"", equivalent)
	require.NoError(t, err, "the sf-string form of the key is the same key")
	require.Equal(t, first.Request.ID, again.Request.ID)

	// After a restart (a new service on the same database): still the same.
	svc2, err := requests.NewService(requests.Config{DB: f.db, Jobs: f.jobs, Keys: f.keys, Policy: f.engine, Issuer: issuer, RequestsURL: requestsURL})
	require.NoError(t, err)
	again, err = svc2.Submit(ctx, f.pep, "k", raw)
	require.NoError(t, err)
	require.Equal(t, first.Request.ID, again.Request.ID)

	// Same key, different body: 409 duplicate_request, and nothing changes.
	body["context"] = map[string]any{"tenant": "acme", "note": "changed"}
	_, err = f.svc.Submit(ctx, f.pep, "k", mustJSON(t, body))
	require.Equal(t, authzen.ProblemDuplicateRequest, requests.ErrorCode(err))
	require.Equal(t, 1, count(t, f, "arap.requests"))

	// A retry long after the response was lost, when its binding_token has
	// expired and the checks refuse it: still the original handle.
	f.clock.Advance(11 * time.Minute)
	again, err = f.svc.Submit(ctx, f.pep, "k", raw)
	require.NoError(t, err, "an expired token's retry is answered from the key")
	require.True(t, again.Replayed)
	require.Equal(t, first.Request.ID, again.Request.ID)

	// Keys are scoped to the client: another client's "k" is its own.
	_, err = f.svc.Submit(ctx, f.other, "k", f.fresh("wire_transfer", map[string]any{"to": "x", "amount": 30000}))
	require.Equal(t, authzen.ProblemInvalidDenialBinding, requests.ErrorCode(err), "the token was issued to pep, not other-pep")

	// No key: accepted as a fresh request each time (with a fresh denial).
	a, err := f.svc.Submit(ctx, f.pep, "", f.fresh("wire_transfer", map[string]any{"to": "acct-1", "amount": 30000}))
	require.NoError(t, err)
	b, err := f.svc.Submit(ctx, f.pep, "", f.fresh("wire_transfer", map[string]any{"to": "acct-1", "amount": 30000}))
	require.NoError(t, err)
	require.NotEqual(t, a.Request.ID, b.Request.ID)
}

func TestConcurrentDuplicatesCreateOneRequest(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	raw := f.fresh("wire_transfer", map[string]any{"to": "acct-991", "amount": 50000})
	const n = 50
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := f.svc.Submit(ctx, f.pep, "same-key", raw)
			errs[i] = err
			if err == nil {
				ids[i] = res.Request.ID
			}
		}()
	}
	close(start)
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
		require.Equal(t, ids[0], ids[i])
	}
	require.Equal(t, 1, count(t, f, "arap.requests"))
	require.Equal(t, 1, count(t, f, "arap.audit_events WHERE kind = 'request.submitted'"))
}

// TestConcurrentKeyDifferentBodiesCreateOne: submissions racing under one
// Idempotency-Key with different bodies (each its own denial, so no jti is
// shared and only the key can stop them) create one request; the others get
// duplicate_request and leave nothing behind.
func TestConcurrentKeyDifferentBodiesCreateOne(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	const n = 8
	bodies := make([][]byte, n)
	for i := range n {
		bodies[i] = f.fresh("wire_transfer", map[string]any{"to": fmt.Sprint("acct-", i), "amount": 50000})
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			_, errs[i] = f.svc.Submit(ctx, f.pep, "one-key", bodies[i])
		})
	}
	close(start)
	wg.Wait()
	created := 0
	for _, err := range errs {
		if err == nil {
			created++
			continue
		}
		require.Equal(t, authzen.ProblemDuplicateRequest, requests.ErrorCode(err), "%v", err)
	}
	require.Equal(t, 1, created)
	require.Equal(t, 1, count(t, f, "arap.requests"))
	require.Equal(t, 1, count(t, f, "arap.audit_events WHERE kind = 'request.submitted'"))
}

// TestDuplicateCommittedDuringChecksIsReplayed forces the interleaving the
// 50-goroutine test above only sometimes hits: a duplicate is still being
// checked when its twin commits, so its creating batch finds the key taken.
// It is answered as the retry it is (the twin's handle, replayed), not
// refused; a different body under the key in the same position gets
// duplicate_request. The caller's actor check (MayAssertActor), which runs
// before the creating batch, holds it there.
func TestDuplicateCommittedDuringChecksIsReplayed(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	// held returns a caller that stops in its actor check until release is
	// closed, and says when it got there.
	held := func() (requests.Caller, <-chan struct{}, chan<- struct{}) {
		checking, release := make(chan struct{}), make(chan struct{})
		c := f.pep
		once := sync.OnceFunc(func() { close(checking); <-release })
		c.MayAssertActor = func(id string) bool { once(); return f.pep.MayAssertActor(id) }
		return c, checking, release
	}
	type result struct {
		sub *requests.Submitted
		err error
	}
	for _, sameBody := range []bool{true, false} {
		t.Run(fmt.Sprint("same body ", sameBody), func(t *testing.T) {
			key := fmt.Sprint("key-", sameBody)
			raw := f.fresh("wire_transfer", map[string]any{"to": key, "amount": 50000})
			body := raw
			if !sameBody {
				body = patch(raw, "context", map[string]any{"tenant": "acme", "note": "other"})
			}
			caller, checking, release := held()
			got := make(chan result, 1)
			go func() {
				sub, err := f.svc.Submit(ctx, caller, key, body)
				got <- result{sub, err}
			}()
			select {
			case <-checking: // past its idempotency lookup, which found nothing
			case r := <-got:
				t.Fatalf("the submission ended before its actor check: %v", r.err)
			}
			first, err := f.svc.Submit(ctx, f.pep, key, raw)
			require.NoError(t, err)
			require.False(t, first.Replayed)
			close(release)
			r := <-got
			if sameBody {
				require.NoError(t, r.err)
				require.True(t, r.sub.Replayed)
				require.Equal(t, first.Request.ID, r.sub.Request.ID)
			} else {
				require.Equal(t, authzen.ProblemDuplicateRequest, requests.ErrorCode(r.err), "%v", r.err)
			}
			require.Equal(t, 1, count(t, f, fmt.Sprintf("arap.requests WHERE id = '%s'", first.Request.ID)))
		})
	}
	require.Equal(t, 2, count(t, f, "arap.requests"))
	require.Equal(t, 2, count(t, f, "arap.audit_events WHERE kind = 'request.submitted'"))
}

func TestSubmissionErrors(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	wire := map[string]any{"to": "acct-991", "amount": 50000}
	cases := []struct {
		name   string
		key    string
		body   func() []byte
		code   string
		detail string
	}{
		{"malformed JSON", "", func() []byte { return []byte(`{"subject": `) }, authzen.ProblemInvalidRequest, "not valid JSON"},
		{"duplicate member", "", func() []byte { return []byte(`{"subject": {}, "subject": {}}`) }, authzen.ProblemInvalidRequest, "not valid JSON"},
		{"not an object", "", func() []byte { return []byte(`[1]`) }, authzen.ProblemInvalidRequest, "JSON object"},
		{"NUL in a string", "", func() []byte { return []byte(`{"subject": {"id": "a\u0000b"}}`) }, authzen.ProblemInvalidRequest, "NUL"},
		{"unknown member", "", func() []byte { return patch(f.fresh("wire_transfer", wire), "denail", 1) }, authzen.ProblemInvalidRequest, "unknown member(s) denail"},
		{"unknown denial member", "", func() []byte {
			return patch(f.fresh("wire_transfer", wire), "denial", map[string]any{"binding_tokn": "x", "expires_at": "2026-01-01T00:00:00Z"})
		}, authzen.ProblemInvalidRequest, "denial.binding_tokn"},
		{"wrong type", "", func() []byte { return patch(f.fresh("wire_transfer", wire), "subject", "alice") }, authzen.ProblemInvalidRequest, "wrong type"},
		{"bulk", "", func() []byte { return patch(f.fresh("wire_transfer", wire), "items", []any{map[string]any{}}) }, authzen.ProblemUnsupported, "bulk"},
		{"bulk, null items", "", func() []byte { return patch(f.fresh("wire_transfer", wire), "items", json.RawMessage("null")) }, authzen.ProblemUnsupported, "bulk"},
		{"denial not an object", "", func() []byte { return patch(f.fresh("wire_transfer", wire), "denial", "x") }, authzen.ProblemInvalidRequest, "denial must be an object"},
		{"no denial", "", func() []byte { return patch(f.fresh("wire_transfer", wire), "denial", nil) }, authzen.ProblemNotRequestable, "no denial"},
		{"evaluation_id only", "", func() []byte {
			return patch(f.fresh("wire_transfer", wire), "denial", map[string]any{"evaluation_id": "eval_x", "expires_at": "2026-01-01T00:00:00Z"})
		}, authzen.ProblemInvalidDenialBinding, "binding_token is required"},
		{"forged token", "", func() []byte {
			b := f.fresh("wire_transfer", wire)
			var m map[string]any
			require.NoError(t, json.Unmarshal(b, &m))
			tok := m["denial"].(map[string]any)["binding_token"].(string)
			parts := strings.Split(tok, ".")
			// Re-sign nothing: swap in a payload that binds a smaller amount.
			m["denial"].(map[string]any)["binding_token"] = parts[0] + "." + parts[1][:len(parts[1])-4] + "AAAA." + parts[2]
			return mustJSON(t, m)
		}, authzen.ProblemInvalidDenialBinding, "does not verify"},
		{"garbage token", "", func() []byte {
			return patchDenial(t, f.fresh("wire_transfer", wire), "binding_token", "eyJhbGciOiJub25lIn0.e30.")
		}, authzen.ProblemInvalidDenialBinding, "does not verify"},
		{"different arguments", "", func() []byte {
			b := f.fresh("wire_transfer", wire)
			return patch(b, "resource", map[string]any{"type": "mcp_tool", "id": "wire_transfer", "properties": map[string]any{"arguments": map[string]any{"to": "acct-991", "amount": 5000000}}})
		}, authzen.ProblemInvalidDenialBinding, "does not match the denied evaluation"},
		{"changed relevant context", "", func() []byte {
			req := toolCall("read_customer_record", map[string]any{"customer_id": "c-1"})
			d, hint := f.deny(f.pep, req)
			body := submission(req, d, hint)
			body["context"] = map[string]any{"tenant": "other", "business_justification": "A long enough reason"}
			return mustJSON(t, body)
		}, authzen.ProblemInvalidDenialBinding, "context (tenant)"},
		{"echoed expiry altered", "", func() []byte {
			return patchDenial(t, f.fresh("wire_transfer", wire), "expires_at", time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
		}, authzen.ProblemInvalidDenialBinding, "does not match the expiry the PDP signed"},
		{"evaluation_id altered", "", func() []byte {
			return patchDenial(t, f.fresh("wire_transfer", wire), "evaluation_id", "eval_other")
		}, authzen.ProblemInvalidDenialBinding, "evaluation_id"},
		{"schema violation", "", func() []byte {
			req := toolCall("read_customer_record", map[string]any{"customer_id": "c-1"})
			d, hint := f.deny(f.pep, req)
			body := submission(req, d, hint)
			body["context"] = map[string]any{"tenant": "acme", "business_justification": "short"}
			return mustJSON(t, body)
		}, authzen.ProblemSchemaViolation, "context.business_justification: must be at least 10 characters; give a longer business justification"},
		{"actor the client may not claim", "", func() []byte {
			return patch(f.fresh("wire_transfer", wire), "client", map[string]any{"actor": map[string]any{"id": "agent:demo", "act": map[string]any{"sub": "user:root"}}})
		}, authzen.ProblemActorNotAuthorized, `"user:root"`},
		{"bad idempotency key", "has space", func() []byte { return f.fresh("wire_transfer", wire) }, authzen.ProblemInvalidIdempotencyKey, "printable ASCII"},
		{"overlong idempotency key", strings.Repeat("k", 256), func() []byte { return f.fresh("wire_transfer", wire) }, authzen.ProblemInvalidIdempotencyKey, "longer than"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := count(t, f, "arap.requests")
			_, err := f.svc.Submit(ctx, f.pep, tc.key, tc.body())
			require.Error(t, err)
			require.Equal(t, tc.code, requests.ErrorCode(err), "%v", err)
			require.Contains(t, err.Error(), tc.detail)
			require.Equal(t, before, count(t, f, "arap.requests"), "a refused submission changes nothing")
		})
	}
	require.Zero(t, count(t, f, "arap.requests WHERE binding_jti IS NOT NULL"), "refused submissions do not spend the token")
}

// TestConcurrentReplayCreatesOne: the same binding_token submitted at once
// under different Idempotency-Keys passes every check before the first
// commits; the spent-jti row in the creating batch lets exactly one through,
// and the others leave nothing behind.
func TestConcurrentReplayCreatesOne(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	raw := f.fresh("wire_transfer", map[string]any{"to": "a", "amount": 50000})
	const n = 8
	errs := make(chan error, n)
	start := make(chan struct{})
	for i := range n {
		go func() {
			<-start
			_, err := f.svc.Submit(ctx, f.pep, fmt.Sprintf("race-%d", i), raw)
			errs <- err
		}()
	}
	close(start)
	created := 0
	for range n {
		err := <-errs
		if err == nil {
			created++
			continue
		}
		require.Equal(t, authzen.ProblemInvalidDenialBinding, requests.ErrorCode(err), "%v", err)
	}
	require.Equal(t, 1, created)
	require.Equal(t, 1, count(t, f, "arap.requests"))
	require.Equal(t, 1, count(t, f, "arap.requests WHERE idempotency_key IS NOT NULL"))
	require.Equal(t, 1, count(t, f, "arap.requests WHERE binding_jti IS NOT NULL"))
	require.Equal(t, 1, count(t, f, "arap.audit_events WHERE kind = 'request.submitted'"))
}

func TestBindingTokenReplayAndExpiry(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	raw := f.fresh("wire_transfer", map[string]any{"to": "a", "amount": 50000})
	_, err := f.svc.Submit(ctx, f.pep, "k1", raw)
	require.NoError(t, err)
	// The same token under another key is a replay, not a retry.
	_, err = f.svc.Submit(ctx, f.pep, "k2", raw)
	require.Equal(t, authzen.ProblemInvalidDenialBinding, requests.ErrorCode(err))
	require.Contains(t, err.Error(), "jti replay")
	require.Equal(t, 1, count(t, f, "arap.requests"), "the refused replay wrote nothing")
	require.Equal(t, 1, count(t, f, "arap.requests WHERE idempotency_key IS NOT NULL"))
	require.Equal(t, 1, count(t, f, "arap.audit_events WHERE kind = 'request.submitted'"))

	// A denial past its expiry (10 minutes by default, plus 30s of skew).
	stale := f.fresh("wire_transfer", map[string]any{"to": "b", "amount": 50000})
	f.clock.Advance(10*time.Minute + 20*time.Second)
	_, err = f.svc.Submit(ctx, f.pep, "k3", stale)
	require.NoError(t, err, "within the clock-skew tolerance")
	stale = f.fresh("wire_transfer", map[string]any{"to": "c", "amount": 50000})
	f.clock.Advance(10*time.Minute + 31*time.Second)
	_, err = f.svc.Submit(ctx, f.pep, "k4", stale)
	require.Equal(t, authzen.ProblemExpiredDenial, requests.ErrorCode(err))

	// A denial whose rule the policy no longer offers is not requestable.
	raw = f.fresh("wire_transfer", map[string]any{"to": "d", "amount": 50000})
	p, err := evaluation.Parse("new.yaml", []byte("version: 1\nrules:\n  - name: wire_transfer\n    match: {resource_id: wire_transfer}\n    effect: deny\n"))
	require.NoError(t, err)
	f.engine.SetPolicy(p)
	_, err = f.svc.Submit(ctx, f.pep, "k5", raw)
	require.Equal(t, authzen.ProblemNotRequestable, requests.ErrorCode(err))
}

func TestStatusIsOnlyForTheSubmitter(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	res, err := f.svc.Submit(ctx, f.pep, "", f.fresh("wire_transfer", map[string]any{"to": "a", "amount": 50000}))
	require.NoError(t, err)
	got, err := f.svc.Get(ctx, f.pep, res.Request.ID)
	require.NoError(t, err)
	require.Equal(t, requests.Pending, got.Status)
	_, err = f.svc.Get(ctx, f.other, res.Request.ID)
	require.Equal(t, authzen.ProblemUnknownTask, requests.ErrorCode(err))
	_, err = f.svc.Get(ctx, f.pep, "arq_nope")
	require.Equal(t, authzen.ProblemUnknownTask, requests.ErrorCode(err))
	_, err = f.svc.Cancel(ctx, f.other, res.Request.ID, "", "")
	require.Equal(t, authzen.ProblemUnknownTask, requests.ErrorCode(err))
}

func TestCancel(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	res, err := f.svc.Submit(ctx, f.pep, "", f.fresh("wire_transfer", map[string]any{"to": "a", "amount": 50000}))
	require.NoError(t, err)
	id := res.Request.ID
	r, err := f.svc.Cancel(ctx, f.pep, id, "", "user changed their mind")
	require.NoError(t, err)
	require.Equal(t, requests.Cancelled, r.Status)
	require.NotNil(t, r.TerminalAt)
	h := r.Handle(f.svc.StatusEndpoint(id))
	require.Nil(t, h.Task.Links, "no cancel link once terminal")
	require.Equal(t, requests.ReasonCancelledByPEP, h.Task.Display[authzen.DisplayStatusReason])

	_, err = f.svc.Cancel(ctx, f.pep, id, "", "")
	require.Equal(t, authzen.ProblemInvalidTaskState, requests.ErrorCode(err))
	require.Contains(t, err.Error(), "already cancelled")

	events, err := audit.Chain(ctx, f.db, id)
	require.NoError(t, err)
	require.Len(t, events, 2)
	require.Equal(t, "request.cancelled", events[1].Kind)
	require.Contains(t, string(events[1].Data), "user changed their mind")
}

func TestExpiry(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	res, err := f.svc.Submit(ctx, f.pep, "", f.fresh("wire_transfer", map[string]any{"to": "a", "amount": 50000}))
	require.NoError(t, err)
	id := res.Request.ID

	_, err = f.svc.Expire(ctx, id)
	require.Equal(t, "not_due", requests.ErrorCode(err), "nothing expires before its deadline")

	f.clock.Advance(24*time.Hour + time.Second)
	// A cancel after the deadline loses to expiry; the reader sees expired.
	_, err = f.svc.Cancel(ctx, f.pep, id, "", "")
	require.Equal(t, authzen.ProblemInvalidTaskState, requests.ErrorCode(err))
	r, err := f.svc.Get(ctx, f.pep, id)
	require.NoError(t, err)
	require.Equal(t, requests.Expired, r.Status)
	require.Equal(t, requests.ReasonTimeout, r.StatusReason, "a timeout is not a denial")

	_, err = f.svc.Expire(ctx, id)
	require.Equal(t, authzen.ProblemInvalidTaskState, requests.ErrorCode(err))
	require.Equal(t, 1, count(t, f, fmt.Sprintf("arap.audit_events WHERE chain = '%s' AND kind = 'request.expired'", id)))

	// Past retention the handle answers task_expired.
	f.clock.Advance(7*24*time.Hour + time.Minute)
	_, err = f.svc.Get(ctx, f.pep, id)
	require.Equal(t, authzen.ProblemTaskExpired, requests.ErrorCode(err))
}

// TestStateMachine enumerates every (from, to) pair: only pending moves, and
// only to a terminal state; a terminal request never changes.
func TestStateMachine(t *testing.T) {
	for _, from := range requests.AllStatuses {
		for _, to := range requests.AllStatuses {
			want := from == requests.Pending && to != requests.Pending
			require.Equal(t, want, requests.CanTransition(from, to), "%s -> %s", from, to)
		}
	}
	f := setup(t)
	ctx := context.Background()
	for _, from := range requests.AllStatuses {
		if from == requests.Pending {
			continue
		}
		for _, to := range requests.AllStatuses {
			if to == requests.Pending {
				continue
			}
			t.Run(fmt.Sprintf("%s to %s", from, to), func(t *testing.T) {
				res, err := f.svc.Submit(ctx, f.pep, "", f.fresh("wire_transfer", map[string]any{"to": "a", "amount": 50000}))
				require.NoError(t, err)
				id := res.Request.ID
				_, err = f.db.Exec(ctx, `UPDATE arap.requests SET status = $2, terminal_at = now() WHERE id = $1`, id, from)
				require.NoError(t, err)
				if to == requests.Expired {
					f.clock.Advance(25 * time.Hour)
					defer f.clock.Advance(-25 * time.Hour)
				}
				_, err = f.svc.Transition(ctx, id, requests.Change{To: to, Reason: "x", Actor: "test"})
				require.Equal(t, authzen.ProblemInvalidTaskState, requests.ErrorCode(err))
				var status string
				require.NoError(t, f.db.QueryRow(ctx, `SELECT status FROM arap.requests WHERE id = $1`, id).Scan(&status))
				require.Equal(t, string(from), status)
			})
		}
	}
}

// TestReadRacingTheSweep: a read after the deadline that meets the sweep
// holding the row (its batch not yet committed) answers with the request as
// the sweep ended it, not with the conflict its own expiry attempt ran into.
func TestReadRacingTheSweep(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	res, err := f.svc.Submit(ctx, f.pep, "", f.fresh("wire_transfer", map[string]any{"to": "a", "amount": 50000}))
	require.NoError(t, err)
	id := res.Request.ID
	f.clock.Advance(24*time.Hour + time.Second)

	sweep, err := f.db.Begin(ctx)
	require.NoError(t, err)
	defer sweep.Rollback(ctx)
	_, err = sweep.Exec(ctx, `SELECT 1 FROM arap.requests WHERE id = $1 FOR UPDATE`, id)
	require.NoError(t, err)

	type answer struct {
		r   *requests.Request
		err error
	}
	got := make(chan answer, 1)
	go func() {
		r, err := f.svc.Get(ctx, f.pep, id)
		got <- answer{r, err}
	}()
	// The read's expiry waits on the sweep's row lock.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var waiting int
		require.NoError(c, f.db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'UPDATE arap.requests%'`).Scan(&waiting))
		assert.Equal(c, 1, waiting, "reads waiting on the sweep's lock")
	}, 30*time.Second, 20*time.Millisecond)
	_, err = sweep.Exec(ctx, `UPDATE arap.requests SET status = 'expired', status_reason = 'timeout', terminal_at = now(), updated_at = now()
		WHERE id = $1`, id)
	require.NoError(t, err)
	require.NoError(t, sweep.Commit(ctx))

	a := <-got
	require.NoError(t, a.err)
	require.Equal(t, requests.Expired, a.r.Status)
}

// TestExpiryJob runs real River workers: a request with a 2 s lifetime is
// expired by the periodic sweep, once.
func TestExpiryJob(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	workers := river.NewWorkers()
	f.svc.AddWorkers(workers)
	worker, err := river.NewClient(riverpgxv5.New(f.db), &river.Config{
		Schema: migrations.RiverSchema, Workers: workers,
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 5},
			requests.QueueMaintenance: {MaxWorkers: requests.MaintenanceWorkers}},
		PeriodicJobs:      f.svc.PeriodicJobs(),
		FetchPollInterval: 100 * time.Millisecond,
	})
	require.NoError(t, err)
	require.NoError(t, worker.Start(ctx))
	defer worker.Stop(ctx)

	res, err := f.svc.Submit(ctx, f.pep, "", f.fresh("quick", map[string]any{}))
	require.NoError(t, err)
	id := res.Request.ID
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var status string
		require.NoError(c, f.db.QueryRow(ctx, `SELECT status FROM arap.requests WHERE id = $1`, id).Scan(&status))
		assert.Equal(c, "expired", status)
	}, 60*time.Second, 100*time.Millisecond)
	require.Equal(t, 1, count(t, f, fmt.Sprintf("arap.audit_events WHERE chain = '%s' AND kind = 'request.expired'", id)))
}

// TestIdempotencyKeyReclaimedAfterRetention: a key is remembered while its
// request is pending and until 24 h after it ended (ARAP's minimum); after
// that it is reclaimable and treated as new: a new body under it creates a
// new request, and the old request no longer holds it. The retry of the
// old body is then judged as new too (its token has long expired).
func TestIdempotencyKeyReclaimedAfterRetention(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	oldRaw := f.fresh("wire_transfer", map[string]any{"to": "a", "amount": 50000})
	done, err := f.svc.Submit(ctx, f.pep, "old", oldRaw)
	require.NoError(t, err)
	_, err = f.svc.Cancel(ctx, f.pep, done.Request.ID, "", "")
	require.NoError(t, err)
	f.clock.Advance(23 * time.Hour)
	pending, err := f.svc.Submit(ctx, f.pep, "live", f.fresh("wire_transfer", map[string]any{"to": "b", "amount": 50000}))
	require.NoError(t, err)

	// Within the retention: the ended request's key still answers.
	again, err := f.svc.Submit(ctx, f.pep, "old", oldRaw)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, done.Request.ID, again.Request.ID)
	_, err = f.svc.Submit(ctx, f.pep, "old", f.fresh("wire_transfer", map[string]any{"to": "c", "amount": 50000}))
	require.Equal(t, authzen.ProblemDuplicateRequest, requests.ErrorCode(err), "%v", err)

	f.clock.Advance(2 * time.Hour) // 25 h after the cancel
	_, err = f.svc.Submit(ctx, f.pep, "old", oldRaw)
	require.Equal(t, authzen.ProblemExpiredDenial, requests.ErrorCode(err), "a forgotten key's retry is judged as new: %v", err)
	reused, err := f.svc.Submit(ctx, f.pep, "old", f.fresh("wire_transfer", map[string]any{"to": "d", "amount": 50000}))
	require.NoError(t, err, "the key is reclaimed")
	require.False(t, reused.Replayed)
	require.NotEqual(t, done.Request.ID, reused.Request.ID)
	var held *string
	require.NoError(t, f.db.QueryRow(ctx, `SELECT idempotency_key FROM arap.requests WHERE id = $1`, done.Request.ID).Scan(&held))
	require.Nil(t, held, "the ended request no longer holds the key")
	again, err = f.svc.Submit(ctx, f.pep, "old", f.fresh("wire_transfer", map[string]any{"to": "d", "amount": 50000}))
	require.Equal(t, authzen.ProblemDuplicateRequest, requests.ErrorCode(err), "the key is the new request's now: %v", err)

	// A request that has not ended keeps its key however old it is.
	_, err = f.svc.Submit(ctx, f.pep, "live", f.fresh("wire_transfer", map[string]any{"to": "e", "amount": 50000}))
	require.Equal(t, authzen.ProblemDuplicateRequest, requests.ErrorCode(err), "%v", err)
	require.Equal(t, 1, count(t, f, fmt.Sprintf("arap.requests WHERE id = '%s' AND idempotency_key = 'live'", pending.Request.ID)))
}

// TestConcurrentReclaimCreatesOne: submissions racing to reuse a key past
// its retention, with one body, make one new request and all get its handle.
func TestConcurrentReclaimCreatesOne(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	done, err := f.svc.Submit(ctx, f.pep, "k", f.fresh("wire_transfer", map[string]any{"to": "a", "amount": 50000}))
	require.NoError(t, err)
	_, err = f.svc.Cancel(ctx, f.pep, done.Request.ID, "", "")
	require.NoError(t, err)
	f.clock.Advance(25 * time.Hour)
	raw := f.fresh("wire_transfer", map[string]any{"to": "b", "amount": 50000})
	const n = 8
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			res, err := f.svc.Submit(ctx, f.pep, "k", raw)
			errs[i] = err
			if err == nil {
				ids[i] = res.Request.ID
			}
		})
	}
	close(start)
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
		require.Equal(t, ids[0], ids[i])
	}
	require.NotEqual(t, done.Request.ID, ids[0])
	require.Equal(t, 2, count(t, f, "arap.requests"))
	require.Equal(t, 1, count(t, f, "arap.requests WHERE idempotency_key IS NOT NULL"))
}

// TestJTISpentOnce: a binding_token creates one request, whether the
// submissions carry no key, different keys, or a key and none; a refused
// replay records nothing, not even its key.
func TestJTISpentOnce(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	raw := f.fresh("wire_transfer", map[string]any{"to": "a", "amount": 50000})
	_, err := f.svc.Submit(ctx, f.pep, "", raw)
	require.NoError(t, err)
	for _, key := range []string{"", "x"} {
		_, err = f.svc.Submit(ctx, f.pep, key, raw)
		require.Equal(t, authzen.ProblemInvalidDenialBinding, requests.ErrorCode(err), "key %q: %v", key, err)
		require.ErrorContains(t, err, "jti replay")
	}
	require.Equal(t, 1, count(t, f, "arap.requests"))
	// "x" was not taken by the refused replay: a fresh denial may use it.
	res, err := f.svc.Submit(ctx, f.pep, "x", f.fresh("wire_transfer", map[string]any{"to": "b", "amount": 50000}))
	require.NoError(t, err)
	require.False(t, res.Replayed)
}

func count(t *testing.T, f *fixture, from string) int {
	t.Helper()
	var n int
	require.NoError(t, f.db.QueryRow(context.Background(), "SELECT count(*) FROM "+from).Scan(&n))
	return n
}

func patch(raw []byte, member string, v any) []byte {
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		panic(err)
	}
	if v == nil {
		delete(m, member)
	} else {
		m[member] = v
	}
	b, _ := json.Marshal(m)
	return b
}

func patchDenial(t *testing.T, raw []byte, member string, v any) []byte {
	var m map[string]any
	require.NoError(t, json.Unmarshal(raw, &m))
	m["denial"].(map[string]any)[member] = v
	return mustJSON(t, m)
}

// ExpireDue expires exactly the due pending requests, in batches, each once,
// with its audit event; concurrent sweeps share the work without doubling it.
func TestExpireDueSweeps(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	var due, later []string
	for i := range 7 {
		res, err := f.svc.Submit(ctx, f.pep, "", f.fresh("quick", map[string]any{"i": i}))
		require.NoError(t, err)
		due = append(due, res.Request.ID)
	}
	res, err := f.svc.Submit(ctx, f.pep, "", f.fresh("wire_transfer", map[string]any{"to": "a", "amount": 50000}))
	require.NoError(t, err)
	later = append(later, res.Request.ID)
	_, err = f.svc.Cancel(ctx, f.pep, due[0], "", "")
	require.NoError(t, err)

	n, err := f.svc.ExpireDue(ctx, 10)
	require.NoError(t, err)
	require.Zero(t, n, "nothing is due yet")

	f.clock.Advance(time.Minute)
	defer f.clock.Advance(-time.Minute)
	var wg sync.WaitGroup
	var total atomic.Int64
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				n, err := f.svc.ExpireDue(ctx, 2)
				assert.NoError(t, err)
				total.Add(int64(n))
				if n < 2 {
					return
				}
			}
		}()
	}
	wg.Wait()
	require.EqualValues(t, 6, total.Load(), "the six due pending requests, not the cancelled one")
	for _, id := range due[1:] {
		var status string
		require.NoError(t, f.db.QueryRow(ctx, `SELECT status FROM arap.requests WHERE id = $1`, id).Scan(&status))
		require.Equal(t, "expired", status)
		require.Equal(t, 1, count(t, f, fmt.Sprintf("arap.audit_events WHERE chain = '%s' AND kind = 'request.expired'", id)))
	}
	var status string
	require.NoError(t, f.db.QueryRow(ctx, `SELECT status FROM arap.requests WHERE id = $1`, due[0]).Scan(&status))
	require.Equal(t, "cancelled", status)
	require.NoError(t, f.db.QueryRow(ctx, `SELECT status FROM arap.requests WHERE id = $1`, later[0]).Scan(&status))
	require.Equal(t, "pending", status, "a 24 h request is not due after a minute")
	rep, err := audit.Verify(ctx, f.db)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", rep.Breaks)
}

// TestBadRowStopsOnlyItself: a due request whose row no longer reads fails
// its sweep batch; the sweep then expires the batch one by one, so the
// others still expire and only the bad one stays (logged) for an operator.
func TestBadRowStopsOnlyItself(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	var ids []string
	for i := range 3 {
		res, err := f.svc.Submit(ctx, f.pep, "", f.fresh("quick", map[string]any{"i": i}))
		require.NoError(t, err)
		ids = append(ids, res.Request.ID)
	}
	_, err := f.db.Exec(ctx, `UPDATE arap.requests SET callback = '{"events": 5}' WHERE id = $1`, ids[1])
	require.NoError(t, err)
	f.clock.Advance(time.Minute)
	defer f.clock.Advance(-time.Minute)

	_, err = f.svc.ExpireDue(ctx, requests.ExpireBatch)
	require.Error(t, err, "the batch with the bad row fails")
	require.NoError(t, (&requests.ExpireDueWorker{Service: f.svc}).Work(ctx, nil))
	for i, id := range ids {
		var status string
		require.NoError(t, f.db.QueryRow(ctx, `SELECT status FROM arap.requests WHERE id = $1`, id).Scan(&status))
		if i == 1 {
			require.Equal(t, "pending", status, "the bad row cannot be ended")
		} else {
			require.Equal(t, "expired", status, "request %d expired despite the bad row", i)
		}
	}
}

// TestRetryAnsweredDespiteAPassingFault: a retry whose checks meet a fault
// (here the callback allow-list cannot be read) is still answered from its
// Idempotency-Key's record; a new submission meeting it gets the fault.
func TestRetryAnsweredDespiteAPassingFault(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	var failing atomic.Bool
	svc, err := requests.NewService(requests.Config{DB: f.db, Jobs: f.jobs, Keys: f.keys, Policy: f.engine, Issuer: issuer, RequestsURL: requestsURL,
		CheckCallback: func(context.Context, string, *authzen.Callback) error {
			if failing.Load() {
				return errors.New("allow-list unreadable")
			}
			return nil
		}})
	require.NoError(t, err)
	withCallback := func(tool string, args map[string]any) []byte {
		req := toolCall(tool, args)
		d, hint := f.deny(f.pep, req)
		body := submission(req, d, hint)
		body["callback"] = map[string]any{"endpoint": "https://pep.example/cb", "state": "tsk_1"}
		return mustJSON(t, body)
	}
	raw := withCallback("wire_transfer", map[string]any{"to": "acct-1", "amount": 50000})
	first, err := svc.Submit(ctx, f.pep, "k", raw)
	require.NoError(t, err)
	failing.Store(true)
	again, err := svc.Submit(ctx, f.pep, "k", raw)
	require.NoError(t, err, "the retry is answered from its key")
	require.Equal(t, first.Request.ID, again.Request.ID)
	_, err = svc.Submit(ctx, f.pep, "k2", withCallback("wire_transfer", map[string]any{"to": "acct-2", "amount": 50000}))
	require.ErrorContains(t, err, "allow-list unreadable")
	require.Equal(t, 1, count(t, f, "arap.requests"))
}

// TestResolverRuleSubmissionIsAtomic: a rule with resolvers creates its
// request in an explicit transaction (River's insert of the resolve job
// needs one). Concurrent duplicates under one key make one request and one
// job, a retry gets the same handle, and the token under another key is a
// replay that writes nothing.
func TestResolverRuleSubmissionIsAtomic(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	ctx := context.Background()
	raw := f.fresh("deploy_service", map[string]any{"service": "api", "version": "1.2"})
	const n = 8
	ids := make(chan string, n)
	errs := make(chan error, n)
	start := make(chan struct{})
	for range n {
		go func() {
			<-start
			s, err := f.svc.Submit(ctx, f.pep, "deploy-1", raw)
			if err != nil {
				errs <- err
				return
			}
			ids <- s.Request.ID
		}()
	}
	close(start)
	var first string
	for range n {
		select {
		case err := <-errs:
			t.Fatal(err)
		case id := <-ids:
			if first == "" {
				first = id
			}
			require.Equal(t, first, id, "every duplicate gets the one handle")
		}
	}
	again, err := f.svc.Submit(ctx, f.pep, "deploy-1", raw)
	require.NoError(t, err)
	require.Equal(t, first, again.Request.ID)
	_, err = f.svc.Submit(ctx, f.pep, "deploy-2", raw)
	require.Equal(t, authzen.ProblemInvalidDenialBinding, requests.ErrorCode(err))
	require.Equal(t, 1, count(t, f, "arap.requests"))
	require.Equal(t, 1, count(t, f, "arap.requests WHERE idempotency_key IS NOT NULL"))
	require.Equal(t, 1, count(t, f, "river.river_job WHERE kind = 'requests.resolve'"))
}
