package notify_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/mailsink"
	"github.com/omcp/arap/requests"
)

const remindPolicy = `version: 1
rules:
  - name: wire_transfer_large
    match: {resource_id: wire_transfer}
    effect: request
    display: {title: Treasury approval}
    approval:
      quorum: 2
      groups: [treasury]
      remind_every: 10m
      escalate_after: 1h
      escalate_to: platform
`

func subjectPrefix(id, prefix string) func(mailsink.Message) bool {
	return func(m mailsink.Message) bool { return about(id)(m) && strings.HasPrefix(m.Subject, prefix) }
}

// due moves request id's column (next_reminder_at or escalate_at) to the
// past: the backend runs on the real clock, so the test moves the
// request's schedule instead of the clock.
func due(t *testing.T, pool *pgxpool.Pool, id, column string) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `UPDATE arap.requests SET `+column+` = now() - interval '1 second' WHERE id = $1`, id)
	require.NoError(t, err)
}

// sweepsDone waits until the backend's River has completed two more
// reminder sweeps than now.
func sweepsDone(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	n := func() int {
		var c int
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM river.river_job WHERE kind = 'requests.remind_due' AND state = 'completed'`).Scan(&c))
		return c
	}
	before := n()
	require.Eventually(t, func() bool { return n() >= before+2 }, 30*time.Second, 50*time.Millisecond)
}

// TestReminderAndEscalationNotices: the escalation tells the escalation
// group (platform: dave, erin) once; a reminder tells the deciders who
// have not voted (carol, dave, erin; not bob, who voted, nor alice), except,
// within an interval of the escalation, those it told (one message, not
// two); after the request ends, nobody is reminded.
func TestReminderAndEscalationNotices(t *testing.T) {
	sink := startSink(t)
	env := backendtest.Start(t, backendtest.Options{Mail: mailTo(sink), Policy: []byte(remindPolicy)})
	ctx := context.Background()
	dir := env.Backend.Directory()
	voter := func(name string) requests.Voter {
		u, err := dir.User(ctx, name)
		require.NoError(t, err)
		return requests.UserVoter(u.Name, u.Identities(), u.Groups)
	}
	id := env.Submit(t, wireCall("alice", "acct-991", 50000))
	waitFor(t, sink, 2, subjectPrefix(id, "Approval needed: "))
	_, err := env.Backend.Requests().Decide(ctx, voter("bob"), id, requests.Decision{Approve: true})
	require.NoError(t, err)
	settled(t, env.Pool, id)

	due(t, env.Pool, id, "escalate_at")
	esc := waitFor(t, sink, 2, subjectPrefix(id, "Escalated to you: approval needed: "))
	require.Equal(t, []string{"dave@example.com", "erin@example.com"}, recipients(esc))
	for _, m := range esc {
		require.Contains(t, m.Text, "This request was not decided within 1h0m0s and was escalated to your group platform: you may now decide it.")
	}

	// A reminder within the interval of the escalation: dave and erin were
	// just told, so only carol is reminded (one message each, not two).
	due(t, env.Pool, id, "next_reminder_at")
	rem := waitFor(t, sink, 1, subjectPrefix(id, "Reminder: approval needed: "))
	require.Equal(t, []string{"carol@example.com"}, recipients(rem))
	require.Contains(t, rem[0].Text, "A request still waits for your decision.")
	sweepsDone(t, env.Pool)
	settled(t, env.Pool, id)
	require.Len(t, waitFor(t, sink, 2, subjectPrefix(id, "Escalated to you: ")), 2, "escalated once")
	require.Len(t, waitFor(t, sink, 1, subjectPrefix(id, "Reminder: ")), 1, "one message per person for the interval")
	// An interval later, everyone who has not voted is reminded.
	_, err = env.Pool.Exec(ctx, `UPDATE arap.requests SET escalated_at = escalated_at - interval '11 minutes' WHERE id = $1`, id)
	require.NoError(t, err)
	due(t, env.Pool, id, "next_reminder_at")
	rem = waitFor(t, sink, 4, subjectPrefix(id, "Reminder: approval needed: "))
	require.Equal(t, []string{"carol@example.com", "carol@example.com", "dave@example.com", "erin@example.com"}, recipients(rem))
	requireNoSecrets(t, env.Pool, id, sink.Messages())

	// erin, escalated in, approves: quorum met. No reminder afterwards.
	out, err := env.Backend.Requests().Decide(ctx, voter("erin"), id, requests.Decision{Approve: true})
	require.NoError(t, err)
	require.Equal(t, requests.Approved, out.Status)
	due(t, env.Pool, id, "next_reminder_at")
	sweepsDone(t, env.Pool)
	settled(t, env.Pool, id)
	require.Len(t, waitFor(t, sink, 4, subjectPrefix(id, "Reminder: ")), 4, "no reminder after the end")
}
