package dev_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/internal/dev"
)

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
