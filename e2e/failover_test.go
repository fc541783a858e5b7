package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/fault"
	"github.com/omcp/arap/internal/pgembed"
	"github.com/omcp/arap/mcp/tasks"
)

// TestFailover (issue 36): PostgreSQL is a primary with a synchronous
// standby, and arapd serve and arapd mcp are given both on one multi-host
// URL (target_session_attrs=read-write). The primary is killed (-9) while
// the front-end holds an approved call just after its execution claim
// committed, the narrowest window of at-most-once; then the standby is
// promoted. While no primary is writable, a decision is answered 503 with
// Retry-After, a tools/call the retryable -31001, and /readyz says not
// ready. After the promotion both processes find the new primary by
// themselves (no restart): the held call runs exactly once and completes,
// a call pending across the failover is approved and runs once, a new
// call goes through, and both audit chains verify. arapchaos --failover
// runs the same under load with many failovers (docs/reliability.md).
func TestFailover(t *testing.T) {
	t.Parallel()
	db := dbtest.NewReplicated(t)
	standby, _ := db.Standby(t, pgembed.StandbyOptions{Name: "node_b", Synchronous: true})
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/arap?sslmode=disable&connect_timeout=5&target_session_attrs=read-write",
		db.Primary.Port(), standby.Port())
	holds := t.TempDir()
	s := newStack(t, stackOptions{policy: flowPolicy, dbURL: url,
		mcpEnv: []string{"ARAP_FAULT_HOLD=pep.after-claim", "ARAP_FAULT_HOLD_DIR=" + holds}})
	ctx := context.Background()
	alice := s.client(s.alice)

	// Two gated calls: the first is approved and held after its claim, the
	// second stays pending across the failover.
	var tasksOf [2]string
	var reqs [2]string
	for i := range tasksOf {
		r, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "failover", "amount": 30000 + i}, nil)
		require.NoError(t, err)
		tasksOf[i] = r.Task.TaskID
		reqs[i] = s.requestOf(r.Task.TaskID)
	}
	require.Equal(t, 200, s.decide(reqs[0], "approve"))
	token := s.mcp.waitHold(t, "pep.after-claim")

	// The primary dies with the claim committed (and, synchronously, on
	// the standby) and the tool not run.
	require.NoError(t, db.Primary.Kill())
	status, header := decideRaw(t, s, reqs[1])
	require.Equal(t, http.StatusServiceUnavailable, status, "a decision while no primary is writable")
	require.NotEmpty(t, header.Get("Retry-After"), "503 says when to retry")
	_, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "failover", "amount": 30002}, nil)
	var rpc *tasks.RPCError
	require.True(t, errors.As(err, &rpc), "a tools/call while no primary is writable: %v", err)
	require.Equal(t, tasks.CodeUnavailable, rpc.Code, "%v", rpc)
	require.Equal(t, http.StatusServiceUnavailable, readyz(t, s.backend.url()), "the backend is not ready without a writable primary")

	promoteCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	require.NoError(t, standby.Promote(promoteCtx))
	require.NoError(t, os.WriteFile(filepath.Join(holds, token), nil, 0o600))

	// The held call finishes on the new primary, having run once.
	d := s.waitTask(alice, tasksOf[0])
	disp, _ := disposition(t, d)
	require.Equal(t, "approved-executed", disp)
	require.Equal(t, 1, s.ledger(tasksOf[0]))

	// The pending one is approved now (the backend found the new primary
	// by itself) and runs once; the holds stay armed, so release it too.
	require.Eventually(t, func() bool { return s.decide(reqs[1], "approve") == 200 }, time.Minute, 100*time.Millisecond)
	token = s.mcp.waitHoldAfter(t, "pep.after-claim", token)
	require.NoError(t, os.WriteFile(filepath.Join(holds, token), nil, 0o600))
	d = s.waitTask(alice, tasksOf[1])
	disp, _ = disposition(t, d)
	require.Equal(t, "approved-executed", disp)
	require.Equal(t, 1, s.ledger(tasksOf[1]))

	// A new call after the failover: allowed below the approval threshold.
	r, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "failover", "amount": 100}, nil)
	require.NoError(t, err)
	require.False(t, r.IsError, "%s", r.Raw)

	require.Equal(t, http.StatusOK, readyz(t, s.backend.url()))
	require.Equal(t, http.StatusOK, readyz(t, s.mcp.url()))
	env := []string{"DATABASE_URL=" + url, "ARAP_MASTER_KEY=" + masterKey, "ARAP_PEP_MASTER_KEY=" + pepMasterKey}
	code, out := startArapctl(t, env, "audit", "verify").exit(t)
	require.Equal(t, 0, code, out)
	code, out = startArapctl(t, env, "audit", "verify", "--pep").exit(t)
	require.Equal(t, 0, code, out)
	s.nothingMoreRuns(map[string]int{tasksOf[0]: 1, tasksOf[1]: 1})
}

// decideRaw approves request id as the ITSM client and returns the status
// and headers.
func decideRaw(t *testing.T, s *stack, id string) (int, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.api+"/v1/requests/"+id+"/decisions", strings.NewReader(`{"decision":"approve","reason":"e2e"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+s.itsmToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}

func readyz(t *testing.T, base string) int {
	t.Helper()
	resp, err := (&http.Client{Timeout: time.Minute}).Get(base + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

// waitHold waits until the process says it is held at point, and returns
// the token that releases it.
func (p *proc) waitHold(t *testing.T, point string) string {
	t.Helper()
	return p.waitHoldAfter(t, point, "")
}

// waitHoldAfter is waitHold for a hold other than the one of token prev.
func (p *proc) waitHoldAfter(t *testing.T, point, prev string) string {
	t.Helper()
	var token string
	require.Eventually(t, func() bool {
		for _, l := range p.logLines() {
			if rest, ok := strings.CutPrefix(l, fault.HoldPrefix+point+" "); ok && rest != prev {
				token = rest
			}
		}
		return token != ""
	}, 2*time.Minute, 20*time.Millisecond, "arapd mcp never held at %s", point)
	return token
}
