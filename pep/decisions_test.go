package pep_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
)

// The decision cache against a real backend: each change the backend
// announces (a policy reload, an attribute, the directory, the front-end's
// own client revoked) reaches the next call, a denial or a requestable
// denial is never reused, a lost change stream turns the cache off, and an
// answer to a request sent before a change is not kept.

// cached is a stack whose gate watches the backend's change stream, and
// counts the evaluations it sends.
type cached struct {
	*stack
	evaluations atomic.Int64
}

func newCached(t *testing.T, o pepOptions) *cached {
	t.Helper()
	c := &cached{stack: newPEP(t, o)}
	c.onBackend(func(r *http.Request, _ []byte) {
		if r.URL.Path == authzen.PathEvaluation {
			c.evaluations.Add(1)
		}
	})
	c.gate.WatchDecisions()
	require.Eventually(t, func() bool { live, _, _ := c.gate.DecisionCache(); return live }, time.Minute, 10*time.Millisecond,
		"the change stream never said hello")
	return c
}

// call calls tool as alice and says whether it ran (false: denied, or
// requestable) and whether the PDP was asked.
func (c *cached) call(t *testing.T, tool string, args map[string]any) (ran, asked bool) {
	t.Helper()
	before := c.evaluations.Load()
	r, err := c.alice.CallTool(context.Background(), tool, args, nil)
	require.NoError(t, err)
	return r.ResultType == tasks.ResultTypeComplete && !r.IsError, c.evaluations.Load() > before
}

// reused waits (the backend's settle time after the hello or a change)
// until an allowed call of tool is answered from the cache.
func (c *cached) reused(t *testing.T, tool string, args map[string]any) {
	t.Helper()
	require.Eventually(t, func() bool {
		ran, asked := c.call(t, tool, args)
		require.True(t, ran, "%s is not allowed", tool)
		return !asked
	}, time.Minute, 100*time.Millisecond, "an allowed call of %s was never answered from the cache", tool)
}

// guardedPolicy is the dev policy with get_balance denied during a freeze
// (an attribute) and allowed only to treasury (the directory).
func guardedPolicy(t *testing.T) []byte {
	t.Helper()
	seed := string(dev.SeedPolicy())
	rule := "  - name: get_balance\n    description: Reading a balance is always allowed.\n    match: {action: tools/call, resource_type: mcp_tool, resource_id: get_balance}\n    effect: allow\n"
	require.Contains(t, seed, rule)
	guarded := `  - name: frozen
    match: {action: tools/call, resource_type: mcp_tool, resource_id: get_balance}
    when: has(attributes.freeze) && attributes.freeze == true
    effect: deny
  - name: get_balance
    match: {action: tools/call, resource_type: mcp_tool, resource_id: get_balance}
    when: "'treasury' in subject_attributes.?groups.orValue([])"
    effect: allow
`
	return []byte(strings.Replace(strings.Replace(seed, rule, guarded, 1), "rules:\n", "subject_attributes: {source: directory}\nrules:\n", 1))
}

// TestDecisionCacheInvalidations: an allowed call reused from the cache
// gets the new decision at the next call after each change the backend
// announces. Each part fails without its announcement (see
// docs/gateway.md, "Decision cache").
func TestDecisionCacheInvalidations(t *testing.T) {
	t.Parallel()
	t.Run("policy reload", func(t *testing.T) {
		t.Parallel()
		c := newCached(t, pepOptions{})
		c.reused(t, "get_balance", map[string]any{})
		deny := strings.Replace(string(dev.SeedPolicy()), "resource_id: get_balance}\n    effect: allow", "resource_id: get_balance}\n    effect: deny", 1)
		require.NotEqual(t, string(dev.SeedPolicy()), deny)
		require.NoError(t, os.WriteFile(c.env.PolicyFile, []byte(deny), 0o600))
		require.NoError(t, c.env.Backend.Reload()) // what SIGHUP runs
		require.Eventually(t, func() bool { ran, _ := c.call(t, "get_balance", map[string]any{}); return !ran }, time.Minute/2, 20*time.Millisecond,
			"a call was still allowed after the policy that denies it was reloaded")
	})
	t.Run("attribute change", func(t *testing.T) {
		t.Parallel()
		c := newCached(t, pepOptions{policy: guardedPolicy(t)})
		require.NoError(t, c.env.Backend.Directory().AddMember(context.Background(), "treasury", "alice", "test"))
		c.reused(t, "get_balance", map[string]any{})
		require.NoError(t, c.env.Backend.Attributes().Set(context.Background(), "freeze", true, "test", nil))
		require.Eventually(t, func() bool { ran, _ := c.call(t, "get_balance", map[string]any{}); return !ran }, time.Minute/2, 20*time.Millisecond,
			"a call was still allowed after the freeze that denies it")
	})
	t.Run("directory change", func(t *testing.T) {
		t.Parallel()
		c := newCached(t, pepOptions{policy: guardedPolicy(t)})
		require.NoError(t, c.env.Backend.Directory().AddMember(context.Background(), "treasury", "alice", "test"))
		c.reused(t, "get_balance", map[string]any{})
		require.NoError(t, c.env.Backend.Directory().RemoveMember(context.Background(), "treasury", "alice", "test"))
		require.Eventually(t, func() bool { ran, _ := c.call(t, "get_balance", map[string]any{}); return !ran }, time.Minute/2, 20*time.Millisecond,
			"a call was still allowed after its caller left the group that allows it")
	})
	t.Run("the front-end's client revoked", func(t *testing.T) {
		t.Parallel()
		c := newCached(t, pepOptions{})
		c.reused(t, "get_balance", map[string]any{})
		_, before, _ := c.gate.DecisionCache()
		_, err := c.env.Backend.Clients().Revoke(context.Background(), "dev-pep", "test")
		require.NoError(t, err)
		// The PDP no longer answers this front-end at all: nothing it
		// decided before may be used.
		require.Eventually(t, func() bool {
			_, err := c.alice.CallTool(context.Background(), "get_balance", map[string]any{}, nil)
			return err != nil
		}, time.Minute/2, 20*time.Millisecond, "a call was still allowed after the front-end's client was revoked at the backend")
		// The stream ends after the change that revoked its client (the
		// cache was emptied by that change) and is refused after it.
		require.Eventually(t, func() bool { live, _, _ := c.gate.DecisionCache(); return !live }, time.Minute, 10*time.Millisecond,
			"the cache is in use without a change stream")
		live, listens, _ := c.gate.DecisionCache()
		require.False(t, live)
		require.Equal(t, before, listens, "a revoked client's stream was served again")
	})
	t.Run("a caller revoked", func(t *testing.T) {
		t.Parallel()
		c := newCached(t, pepOptions{})
		require.NoError(t, c.gate.Callers().Create(context.Background(), "bob-agent", "bob-token-0123", pep.Principal{SubjectType: "user", SubjectID: "bob", ActorID: "agent:demo"}))
		c.reused(t, "get_balance", map[string]any{})
		require.NoError(t, c.gate.Callers().Revoke(context.Background(), "bob-agent"))
		_, asked := c.call(t, "get_balance", map[string]any{})
		require.True(t, asked, "the cache was not emptied when a caller was revoked")
	})
}

// TestDecisionCacheNeverKeepsDenials: a denial and a requestable denial
// are asked of the PDP every time (were either reused, the call would
// run: a reused decision is an allow).
func TestDecisionCacheNeverKeepsDenials(t *testing.T) {
	t.Parallel()
	c := newCached(t, pepOptions{})
	c.reused(t, "get_balance", map[string]any{}) // the settle time has passed
	_, heard, _ := c.gate.DecisionCache()
	over := map[string]any{"to": "acct-1", "amount": 2000000}
	for range 3 {
		ran, asked := c.call(t, "wire_transfer", over)
		require.False(t, ran, "a transfer over the hard limit ran")
		require.True(t, asked, "a denial was reused")
	}
	requestable := map[string]any{"to": "acct-2", "amount": 50000}
	for range 3 {
		before := c.evaluations.Load()
		r, err := c.alice.CallTool(context.Background(), "wire_transfer", requestable, nil)
		require.NoError(t, err)
		require.Equal(t, tasks.ResultTypeTask, r.ResultType, "%s", r.Raw)
		require.Greater(t, c.evaluations.Load(), before, "a requestable denial was reused")
	}
	var ran int
	require.NoError(t, c.db.QueryRow(context.Background(), `SELECT count(*) FROM pep.ledger`).Scan(&ran))
	require.Zero(t, ran, "a denied or requestable transfer ran")
	live, listens, size := c.gate.DecisionCache()
	if live && listens == heard {
		require.Equal(t, 1, size, "only get_balance's allow is kept")
	} else { // the stream was taken for lost meanwhile, which empties the cache
		t.Logf("the change stream was lost during the test (live %v, hellos %d then %d)", live, heard, listens)
		require.LessOrEqual(t, size, 1, "only get_balance's allow is kept")
	}
}

// TestDecisionCacheOffWithoutStream: when the change stream is lost (here
// the backend stops serving it and refuses it after) the cache is emptied
// and unused, so a change the front-end cannot hear of (a policy reload)
// reaches the next call.
func TestDecisionCacheOffWithoutStream(t *testing.T) {
	t.Parallel()
	c := newCached(t, pepOptions{})
	c.reused(t, "get_balance", map[string]any{})
	c.env.Backend.Changes().End() // streams end, none is served after
	require.Eventually(t, func() bool { live, _, _ := c.gate.DecisionCache(); return !live }, time.Minute, 10*time.Millisecond)
	deny := strings.Replace(string(dev.SeedPolicy()), "resource_id: get_balance}\n    effect: allow", "resource_id: get_balance}\n    effect: deny", 1)
	require.NoError(t, os.WriteFile(c.env.PolicyFile, []byte(deny), 0o600))
	require.NoError(t, c.env.Backend.Engine().Reload()) // no announcement at all
	ran, asked := c.call(t, "get_balance", map[string]any{})
	require.True(t, asked, "a call used the cache without a change stream")
	require.False(t, ran, "a call was allowed by a policy no longer in force")
}

// TestDecisionCacheInFlight: an allow whose request was sent before a
// change was heard is not kept (it may have been decided before the
// change): the hook holds the evaluation until the front-end has heard an
// announced change.
func TestDecisionCacheInFlight(t *testing.T) {
	t.Parallel()
	c := newCached(t, pepOptions{})
	// Past the settle time, with one allow kept (not get_balance's).
	c.reused(t, "wire_transfer", map[string]any{"to": "acct-settle", "amount": 100})
	var once sync.Once
	c.onBackend(func(r *http.Request, body []byte) {
		if r.URL.Path != authzen.PathEvaluation || !bytes.Contains(body, []byte(`"get_balance"`)) {
			return
		}
		c.evaluations.Add(1)
		once.Do(func() {
			// A change the decision does not depend on, heard before the
			// request leaves.
			_, _, size := c.gate.DecisionCache()
			require.Equal(t, 1, size)
			require.NoError(t, c.env.Backend.Attributes().Set(context.Background(), "unrelated", 1, "test", nil))
			require.Eventually(t, func() bool { _, _, size := c.gate.DecisionCache(); return size == 0 }, time.Minute, 5*time.Millisecond)
		})
	})
	ran, asked := c.call(t, "get_balance", map[string]any{})
	require.True(t, ran && asked)
	_, _, size := c.gate.DecisionCache()
	require.Zero(t, size, "an allow asked for before a change was kept")
}

// TestDecisionCacheAudit: a call answered from the cache is logged and
// counted as before, its log line saying where its decision came from.
func TestDecisionCacheAudit(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(lockedWriter{&mu, &buf}, nil))
	c := newCached(t, pepOptions{log: log})
	c.reused(t, "get_balance", map[string]any{})
	asked := int(c.evaluations.Load())
	// The access log line is written as the response ends, which the
	// client may see first: wait for every call's line.
	count := func() (fromCache, fromPDP int) {
		mu.Lock()
		defer mu.Unlock()
		for _, line := range strings.Split(buf.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) != nil || m["rpc_method"] != "tools/call" {
				continue
			}
			require.Equal(t, "get_balance", m["tool"])
			require.Equal(t, pep.OutcomeAllowedExecuted, m["outcome"])
			require.Equal(t, "alice-agent", m["caller"])
			switch m["decision"] {
			case "cache":
				fromCache++
			case "pdp":
				fromPDP++
			default:
				t.Fatalf("a call's line does not say where its decision came from: %s", line)
			}
		}
		return fromCache, fromPDP
	}
	require.Eventually(t, func() bool { fromCache, fromPDP := count(); return fromCache == 1 && fromPDP == asked }, time.Minute, 10*time.Millisecond)
	fromCache, fromPDP := count()
	require.Equal(t, 1, fromCache, "the call answered from the cache")
	require.Equal(t, asked, fromPDP, "one line per call the PDP decided")
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
