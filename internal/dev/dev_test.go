package dev_test

import (
	"bytes"
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/signing"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// TestSeedPolicyCompiles keeps the dev policy valid as the format evolves.
func TestSeedPolicyCompiles(t *testing.T) {
	p, err := evaluation.Parse("policy.yaml", dev.SeedPolicy())
	require.NoError(t, err)
	for _, name := range []string{"get_balance", "wire_transfer_large", "delete_repository", "deploy_service", "read_customer_record"} {
		_, ok := p.Rule(name)
		require.True(t, ok, name)
	}
	r, _ := p.Rule("delete_repository")
	require.Equal(t, 2, r.Approval.Quorum)
	require.False(t, r.Approval.MachinesMayApprove())
	r, _ = p.Rule("deploy_service")
	require.Len(t, r.Resolvers, 2)
	require.True(t, r.Approval.Automated)
}

// TestSeedPolicyRefusesHiddenCharactersInTransfers: the dev policy refuses a
// wire_transfer whose arguments an approver could misread, before any rule
// could make it requestable or allow it.
func TestSeedPolicyRefusesHiddenCharactersInTransfers(t *testing.T) {
	p, err := evaluation.Parse("policy.yaml", dev.SeedPolicy())
	require.NoError(t, err)
	var wire []string
	for _, r := range p.Rules {
		if r.Match.ResourceID == "wire_transfer" {
			wire = append(wire, r.Name)
		}
	}
	require.Equal(t, "wire_transfer_hidden_characters", wire[0], "tried before every other wire_transfer rule: %v", wire)
	r, _ := p.Rule("wire_transfer_hidden_characters")
	require.Equal(t, evaluation.EffectDeny, r.Effect)
	require.Equal(t, "hidden_characters", r.Reason)
	require.Contains(t, r.When.Src, "hidden_characters(resource.properties.arguments)")

	keys, err := signing.Open(context.Background(), dbtest.New(t), signing.Options{MasterKey: make([]byte, 32)})
	require.NoError(t, err)
	e, err := evaluation.New(evaluation.Options{Policy: p, Keys: keys, Issuer: "https://pdp.test", RequestsURL: "https://pdp.test/r"})
	require.NoError(t, err)
	transfer := func(to string, amount float64) evaluation.Outcome {
		out, err := e.Evaluate(context.Background(), "cli_test", authzen.EvaluationRequest{
			Subject:  authzen.Object{"type": "user", "id": "alice"},
			Action:   authzen.Object{"name": "tools/call"},
			Resource: authzen.Object{"type": "mcp_tool", "id": "wire_transfer", "properties": map[string]any{"arguments": map[string]any{"to": to, "amount": amount}}},
		})
		require.NoError(t, err)
		return out
	}
	for _, to := range []string{"acct-\u202e199\u202c", "acct\u200b-991", "p\u0430ypal"} {
		for _, amount := range []float64{100, 50000} {
			out := transfer(to, amount)
			require.False(t, out.Decision.Decision, "%q %v", to, amount)
			require.Equal(t, "wire_transfer_hidden_characters", out.Rule)
			require.Equal(t, "hidden_characters", out.Decision.Context.Str(authzen.CtxReason))
			require.NotContains(t, out.Decision.Context, authzen.CtxAccessRequest, "not requestable")
		}
	}
	require.Equal(t, "wire_transfer_large", transfer("acct-991", 50000).Rule, "a clean transfer is unaffected")
	require.Equal(t, "wire_transfer_small", transfer("acct-991", 100).Rule)
}

// lockedBuffer is a bytes.Buffer that Run writes while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestRunRecordsDatabaseURL: `arapd dev` writes the URL of its database to
// <data-dir>/database-url, readable by the user alone, and prints it in its
// banner with any password masked.
func TestRunRecordsDatabaseURL(t *testing.T) {
	u, err := url.Parse(dbtest.URL(t))
	require.NoError(t, err)
	if _, has := u.User.Password(); !has {
		// The tests' cluster trusts local connections: a password is
		// accepted and ignored, and must still not be printed.
		u.User = url.UserPassword(u.User.Username(), "dev-db-secret")
	}
	dbURL := u.String()
	_, secret := u.User.Password()
	dataDir := filepath.Join(t.TempDir(), "dev")
	var out lockedBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- dev.Run(ctx, dev.Options{Addr: "127.0.0.1:0", MCPAddr: "127.0.0.1:0", DataDir: dataDir, DatabaseURL: dbURL, Out: &out}, nil)
	}()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "Ctrl-C stops") }, time.Minute, 50*time.Millisecond, "the banner")

	file := filepath.Join(dataDir, dev.DatabaseURLFile)
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Equal(t, dbURL+"\n", string(b))
	info, err := os.Stat(file)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	banner := out.String()
	require.Contains(t, banner, "Database                       "+u.Redacted()+"\n")
	require.Contains(t, banner, "(in "+file+"; for arapctl: export DATABASE_URL=$(cat "+file+"))", "the data dir is not ./.arap-dev")
	require.NotContains(t, banner, secret)
}
