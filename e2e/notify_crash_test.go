package e2e

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/mailsink"
	"github.com/omcp/arap/notify"
)

// TestNotificationSurvivesCrash kills the backend (SIGKILL at the fault
// point right after an approval commits, before its notifications can be
// sent) and restarts it: the outcome's e-mails, recorded in the approval's
// transaction, reach the requester and the approver, each once.
func TestNotificationSurvivesCrash(t *testing.T) {
	t.Parallel()
	sink, err := mailsink.Start(mailsink.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sink.Close() })

	dbURL := dbtest.URL(t)
	env := []string{"DATABASE_URL=" + dbURL, "ARAP_MASTER_KEY=" + masterKey}
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	require.NoError(t, os.WriteFile(policy, []byte(`version: 1
rules:
  - name: wire_transfer_large
    match: {resource_id: wire_transfer}
    effect: request
    approval: {users: [bob]}
`), 0o600))
	arapctl(t, env, "users", "create", "--name", "bob", "--email", "bob@example.com")
	arapctl(t, env, "users", "create", "--name", "alice", "--email", "alice@example.com")
	out := arapctl(t, env, "clients", "create", "--name", "pep", "--scope", "evaluate,request", "--actor", "agent:*")
	pepToken := regexp.MustCompile(`token: (\S+)`).FindStringSubmatch(out)[1]
	out = arapctl(t, env, "clients", "create", "--name", "itsm", "--scope", "decide,decide_for_people", "--kind", "itsm")
	itsmToken := regexp.MustCompile(`token: (\S+)`).FindStringSubmatch(out)[1]
	// A short job timeout: a notification job the dying process had claimed
	// is rescued after twice this.
	args := []string{"serve", "--addr", "127.0.0.1:0", "--policy", policy, "--job-timeout", "5s",
		"--smtp-url", "smtp+insecure://" + sink.Addr(), "--mail-from", "arap@example.com"}
	crashing := startArapd(t, append(env, "ARAP_FAULT=requests.after-decision-commit"), args...)

	id := request(t, crashing.url(), crashing.url(), pepToken, toolCall("wire_transfer", map[string]any{"to": "acct-991", "amount": 50000}))
	require.Eventually(t, func() bool { return len(sink.Messages()) == 1 }, 30*time.Second, 50*time.Millisecond,
		"bob is asked before the crash")

	req, _ := http.NewRequest("POST", crashing.url()+"/v1/requests/"+id+"/decisions", stringsReader(`{"decision":"approve","on_behalf_of":"bob"}`))
	req.Header.Set("Authorization", "Bearer "+itsmToken)
	req.Header.Set("Content-Type", "application/json")
	_, err = http.DefaultClient.Do(req)
	require.Error(t, err, "the backend dies before it can answer")
	require.Equal(t, -1, crashing.wait(10*time.Second), "killed by SIGKILL")

	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	defer pool.Close()
	var status string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT status FROM arap.requests WHERE id = $1`, id).Scan(&status))
	require.Equal(t, "approved", status, "the approval committed before the crash")

	startArapd(t, env, args...)
	// Wait until nothing more can be sent: every notification job finished
	// (one the dead process had claimed is rescued, then runs).
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var unfinished, events int
		require.NoError(c, pool.QueryRow(context.Background(), `SELECT count(*) FROM river.river_job WHERE kind IN ($1, $2)
			AND state NOT IN ('completed', 'cancelled', 'discarded')`, notify.FanoutArgs{}.Kind(), notify.DeliverArgs{}.Kind()).Scan(&unfinished))
		require.NoError(c, pool.QueryRow(context.Background(), `SELECT count(*) FROM arap.notification_events WHERE request_id = $1`, id).Scan(&events))
		assert.Equal(c, 3, events, "created, decided (the vote) and ended")
		assert.Zero(c, unfinished, "notification jobs not finished")
		assert.Len(c, sink.Messages(), 3)
	}, 3*time.Minute, 100*time.Millisecond) // a rescue can take a minute: the survivor's leadership, River's 30 s rescuer
	var got []string
	for _, m := range sink.Messages() {
		got = append(got, strings.Join(m.To, ",")+" "+m.Subject)
	}
	sort.Strings(got)
	require.Len(t, got, 3, "each notice once: %v", got)
	require.True(t, strings.HasPrefix(got[0], "alice@example.com Request approved"), "%v", got)
	require.True(t, strings.HasPrefix(got[1], "bob@example.com Approval needed"), "%v", got)
	require.True(t, strings.HasPrefix(got[2], "bob@example.com Request approved"), "%v", got)
}
