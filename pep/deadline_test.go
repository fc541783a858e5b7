package pep_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
)

// ticketPolicy: every wire_transfer needs an approval whose request carries
// a change ticket (collected by MRTR on the call, and in-task for a chained
// request), its denial good for two minutes, its request for five.
var ticketPolicy = []byte(`version: 1
rules:
  - name: ticketed
    match: {resource_id: wire_transfer}
    effect: request
    denial_ttl: 2m
    request_ttl: 5m
    approval: {kinds: [itsm]}
    request_schema:
      type: object
      required: [context]
      properties:
        context:
          type: object
          required: [ticket]
          properties:
            ticket: {type: string, pattern: "^CHG[0-9]+$"}
`)

// ticketed calls wire_transfer as alice, answers the MRTR round with ticket
// and returns the task id.
func (p *stack) ticketed(t *testing.T, amount int, ticket string) string {
	t.Helper()
	ctx := context.Background()
	args := map[string]any{"to": "acct-t", "amount": amount}
	r, err := p.alice.CallTool(ctx, "wire_transfer", args, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeInputRequired, r.ResultType, "%s", r.Raw)
	var key string
	for k := range r.InputRequests {
		key = k
	}
	r, err = p.alice.CallTool(ctx, "wire_transfer", args, map[string]any{"requestState": r.RequestState,
		"inputResponses": map[string]any{key: map[string]any{"action": "accept", "content": map[string]any{"ticket": ticket}}}})
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeTask, r.ResultType, "%s", r.Raw)
	return r.Task.TaskID
}

// revokeInto approves task id's request, revokes the approval before it is
// used and advances the task: the re-evaluation refuses the approval and
// the new request needs a ticket, so the task asks for it in-task. It
// returns the key of the question.
func (p *stack) revokeInto(t *testing.T, id string) string {
	t.Helper()
	req := p.request(t, id)
	p.approve(t, req, time.Time{})
	code, out := p.backendAPI(t, dev.ITSMToken, "POST", "/v1/approvals/"+req+"/revoke", map[string]any{"reason": "test"})
	require.Equal(t, 200, code, "%v", out)
	p.advance(t, id)
	d := p.get(t, id)
	require.Equal(t, tasks.InputRequired, d.Status)
	require.Len(t, d.InputRequests, 1)
	for k := range d.InputRequests {
		return k
	}
	return ""
}

// TestEveryWaitingTaskEndsPastItsDeadline (issue 41): a task past its
// deadline ends within one round of the sweep whatever it waits for: a
// decision (pending: expired, denied-not-executed), in-task input (input:
// expired, denied-not-executed; before, nothing ever looked at it), or its
// claimed run's outcome (claimed: outcome-unknown at the execution
// deadline). The fourth waiting phase, a submission not yet confirmed, is
// the reconciler's (TestUnconfirmedSubmissionEndsPastTheDenial).
func TestEveryWaitingTaskEndsPastItsDeadline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPEP(t, pepOptions{policy: ticketPolicy})
	pending := p.ticketed(t, 50401, "CHG1")
	input := p.ticketed(t, 50402, "CHG2")
	p.revokeInto(t, input)
	var inputDeadline, inputLook time.Time
	require.NoError(t, p.db.QueryRow(ctx, `SELECT deadline, look_at FROM pep.approval_tasks WHERE task_id = $1`, input).Scan(&inputDeadline, &inputLook))
	require.WithinDuration(t, time.Now().Add(2*time.Minute), inputDeadline, time.Minute, "the input is awaited while its denial lasts")
	require.Equal(t, inputDeadline, inputLook, "the ask schedules the look that ends it, in its own UPDATE")
	claimed := p.ticketed(t, 50403, "CHG3")
	// A claim whose run was never recorded, as a crash after the claim
	// leaves it.
	_, err := p.db.Exec(ctx, `UPDATE pep.approval_tasks SET phase = 'claimed', claimed_at = now(), exec_deadline = now() + interval '1 minute',
		look_at = now() + interval '1 minute' WHERE task_id = $1`, claimed)
	require.NoError(t, err)

	p.offset.Store(int64(6 * time.Minute)) // past every deadline, by the front-end's clock
	n, err := p.gate.LookDue(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n, "one round takes every task past its deadline")
	for _, id := range []string{pending, input} {
		d := p.task(t, id)
		require.Equal(t, tasks.Completed, d.Status, id)
		require.Equal(t, pep.DeniedNotExecuted, disposition(t, d), id)
		require.Contains(t, string(d.Result), "expired", "the body notes the expiry")
		require.Zero(t, p.ledger(t, id))
	}
	require.Equal(t, pep.OutcomeUnknown, disposition(t, p.task(t, claimed)))
	n, err = p.gate.LookDue(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "ended tasks are not looked at again")
}

// TestInputAnswersNeverLoop (issue 41): the chaos run's task asked for
// input after its approval was revoked and accepted 335 answers without
// moving. An answer moves the task and marks its key answered in one
// transaction, so a repeated answer is ignored once the task has moved on;
// an answer after the input's deadline ends the task, expired, instead of
// leading back to the question.
func TestInputAnswersNeverLoop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPEP(t, pepOptions{policy: ticketPolicy})
	answer := func(key, ticket string) map[string]any {
		return map[string]any{key: map[string]any{"action": "accept", "content": map[string]any{"ticket": ticket}}}
	}

	id := p.ticketed(t, 50411, "CHG1")
	first := p.request(t, id)
	key := p.revokeInto(t, id)
	require.NoError(t, p.alice.Update(ctx, id, answer(key, "CHG11")))
	d := p.get(t, id)
	require.Equal(t, tasks.Working, d.Status, "the answer moved the task on")
	second := p.request(t, id)
	require.NotEqual(t, first, second, "to a new request")
	var answered []string
	require.NoError(t, p.db.QueryRow(ctx, `SELECT answered_keys FROM pep.tasks WHERE id = $1`, id).Scan(&answered))
	require.Equal(t, []string{key}, answered)
	// The same answer again: ignored (no longer outstanding), nothing moves.
	require.NoError(t, p.alice.Update(ctx, id, answer(key, "CHG11")))
	require.Equal(t, second, p.request(t, id))
	var intents int
	require.NoError(t, p.db.QueryRow(ctx, `SELECT count(*) FROM pep.intents WHERE task_id = $1`, id).Scan(&intents))
	require.Equal(t, 2, intents, "one new request for one answer")

	// A move that fails (here its new intent, once, by a trigger) leaves
	// the question outstanding, its key unanswered: the next answer is
	// taken, not ignored.
	failing := p.ticketed(t, 50413, "CHG3")
	key = p.revokeInto(t, failing)
	_, err := p.db.Exec(ctx, `CREATE SEQUENCE fail_once; -- nextval survives the rollback the exception makes
		CREATE FUNCTION fail_once() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.task_id = '`+failing+`' AND nextval('fail_once') = 1 THEN
				RAISE EXCEPTION 'test: the move fails once';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER fail_once BEFORE INSERT ON pep.intents FOR EACH ROW EXECUTE FUNCTION fail_once();`)
	require.NoError(t, err)
	require.Error(t, p.alice.Update(ctx, failing, answer(key, "CHG13")), "the move failed")
	d = p.get(t, failing)
	require.Equal(t, tasks.InputRequired, d.Status)
	require.Equal(t, []string{key}, outstanding(d), "the question is still outstanding")
	require.NoError(t, p.alice.Update(ctx, failing, answer(key, "CHG13")))
	require.Equal(t, tasks.Working, p.get(t, failing).Status, "the second answer was taken")

	// Answered after the input's deadline: the task ends, expired.
	late := p.ticketed(t, 50412, "CHG2")
	key = p.revokeInto(t, late)
	p.offset.Store(int64(3 * time.Minute))
	require.NoError(t, p.alice.Update(ctx, late, answer(key, "CHG12")))
	d = p.task(t, late)
	require.Equal(t, tasks.Completed, d.Status)
	require.Equal(t, pep.DeniedNotExecuted, disposition(t, d))
	require.Contains(t, string(d.Result), "expired")
	require.NoError(t, p.alice.Update(ctx, late, answer(key, "CHG12")), "an answer to an ended task is ignored")
	require.Equal(t, tasks.Completed, p.task(t, late).Status)
}

// outstanding lists d's input request keys not yet answered.
func outstanding(d *tasks.Detailed) []string {
	var keys []string
	for k := range d.InputRequests {
		keys = append(keys, k)
	}
	return keys
}

// TestUnconfirmedSubmissionEndsPastTheDenial (issue 41): a task whose
// submission was made but never confirmed (its process died, or the
// backend stopped answering) is the reconciler's. While the backend cannot
// be reached it tries again each round; once the denial the submission
// carries has expired (no first submission is accepted after it), the task
// ends failed and its intent is left abandoned, so a request that may exist
// is cancelled later.
func TestUnconfirmedSubmissionEndsPastTheDenial(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPEP(t, pepOptions{policy: ticketPolicy})
	args := map[string]any{"to": "acct-t", "amount": 50421}
	r, err := p.alice.CallTool(ctx, "wire_transfer", args, nil)
	require.NoError(t, err)
	var key string
	for k := range r.InputRequests {
		key = k
	}
	inFlight, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) }) // a failing test does not hang
	p.onBackend(func(r *http.Request, _ []byte) {
		if r.Method == http.MethodPost && r.URL.Path == authzen.PathRequests {
			close(inFlight)
			<-release
		}
	})
	called := make(chan error, 1)
	go func() {
		_, err := p.alice.CallTool(ctx, "wire_transfer", args, map[string]any{"requestState": r.RequestState,
			"inputResponses": map[string]any{key: map[string]any{"action": "accept", "content": map[string]any{"ticket": "CHG9"}}}})
		called <- err
	}()
	<-inFlight // the intent is committed; its submission is on its way
	p.onBackend(nil)
	p.down.Store(true)
	var id string
	require.NoError(t, p.db.QueryRow(ctx, `SELECT task_id FROM pep.approval_tasks WHERE phase = 'submitting'`).Scan(&id))

	p.offset.Store(int64(time.Minute)) // idle past the intent grace, the denial still good
	require.NoError(t, p.gate.Reconcile(ctx))
	require.Equal(t, tasks.Working, p.task(t, id).Status, "before the denial expires the reconciler tries again")
	p.offset.Store(int64(2*time.Minute + pep.SubmitGrace + time.Second))
	require.NoError(t, p.gate.Reconcile(ctx))
	d := p.task(t, id)
	require.Equal(t, tasks.Failed, d.Status)
	var state string
	require.NoError(t, p.db.QueryRow(ctx, `SELECT state FROM pep.intents WHERE task_id = $1`, id).Scan(&state))
	require.Equal(t, "abandoned", state, "a request that may exist is found and cancelled later")
	releaseOnce.Do(func() { close(release) })
	<-called
	require.Equal(t, tasks.Failed, p.task(t, id).Status)
}
