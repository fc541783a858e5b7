package arap_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dev"
)

// TestPolicyReloadEndpoint (issue 38): an administrator reloads the policy
// without a signal. A file with errors is refused (422 policy_invalid, each
// problem as FILE:LINE), the running policy stays and the refusal is
// counted; a good one replaces it here and, announced, on the other
// replica, which reloads its own file. Only the admin scope may.
func TestPolicyReloadEndpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := backendtest.Start(t, backendtest.Options{})
	b := backendtest.Start(t, backendtest.Options{Join: a})
	_, adminToken, err := a.Backend.Clients().Create(ctx, clients.New{Name: "ops", Scopes: []string{clients.ScopeAdmin}, Kind: clients.KindAutomation}, "test")
	require.NoError(t, err)
	admin, pep := api{t: t, base: a.URL, token: adminToken}, api{t: t, base: a.URL, token: dev.PEPToken}
	decides := func(env *backendtest.Env) bool {
		return api{t: t, base: env.URL, token: dev.PEPToken}.do("POST", "/access/v1/evaluation", wireCall(50000)).json(t)["decision"].(bool)
	}
	require.False(t, decides(a))

	require.NoError(t, os.WriteFile(a.PolicyFile, []byte("version: 1\nrules:\n  - name: broken\n    when: resource.id ==\n    effect: allow\n"), 0o600))
	r := admin.do("POST", "/v1/admin/policy/reload", nil)
	p := r.problem(t, 422, authzen.ProblemPolicyInvalid)
	require.Contains(t, p["errors"].([]any)[0], a.PolicyFile+":4:")
	require.False(t, decides(a), "the running policy stays")
	require.Contains(t, string(api{t: t, base: a.URL}.do("GET", "/metrics", nil).body), `arap_policy_reloads_total{result="rejected"}`)

	pep.do("POST", "/v1/admin/policy/reload", nil).problem(t, 403, authzen.ProblemInsufficientScope)

	allowAll := []byte("version: 1\nrules:\n  - name: all\n    when: \"true\"\n    effect: allow\n")
	for _, env := range []*backendtest.Env{a, b} {
		require.NoError(t, os.WriteFile(env.PolicyFile, allowAll, 0o600))
	}
	r = admin.do("POST", "/v1/admin/policy/reload", nil)
	require.Equal(t, 200, r.status, "%s", r.body)
	got := r.json(t)
	require.Equal(t, true, got["announced"])
	require.EqualValues(t, 1, got["rules"])
	require.True(t, decides(a))
	require.Eventually(t, func() bool { return decides(b) }, 30*time.Second, 20*time.Millisecond, "the other replica reloads when told")
}
