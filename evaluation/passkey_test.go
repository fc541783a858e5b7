package evaluation_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/evaluation"
)

// TestRequirePasskey: approval.require_passkey is parsed into the approval
// policy (which each request copies), off by default, and refused where no
// person could sign (no people named, or no web channel).
func TestRequirePasskey(t *testing.T) {
	rule := func(approval string) string {
		return "version: 1\nrules:\n  - name: r\n    match: {action: read}\n    effect: request\n    approval:\n" + approval
	}
	p, err := evaluation.Parse("p.yaml", []byte(rule("      groups: [treasury]\n      require_passkey: true\n")))
	require.NoError(t, err)
	r, ok := p.Rule("r")
	require.True(t, ok)
	require.True(t, r.Approval.RequirePasskey)

	p, err = evaluation.Parse("p.yaml", []byte(rule("      groups: [treasury]\n")))
	require.NoError(t, err)
	r, _ = p.Rule("r")
	require.False(t, r.Approval.RequirePasskey, "off unless the rule asks")

	for _, c := range []struct{ approval, want string }{
		{"      kinds: [itsm]\n      require_passkey: true\n", `p.yaml:7: rule "r": approval.require_passkey: only people sign with passkeys`},
		{"      groups: [treasury]\n      channels: [slack]\n      require_passkey: true\n", `p.yaml:7: rule "r": approval.require_passkey: signed decisions are made in the web UI`},
		{"      groups: [treasury]\n      require_passkey: maybe\n", `p.yaml:`},
	} {
		_, err := evaluation.Parse("p.yaml", []byte(rule(c.approval)))
		require.ErrorContains(t, err, c.want, c.approval)
	}
}

// TestPasskeyRuleTakesOnlyTheWeb: a rule requiring a passkey allows no
// channel but the web UI, whatever its channels list says, so neither the
// decision API nor Slack (which then shows no Approve/Deny) offers a way
// to decide it.
func TestPasskeyRuleTakesOnlyTheWeb(t *testing.T) {
	p := evaluation.ApprovalPolicy{RequirePasskey: true}
	require.True(t, p.AllowsChannel(evaluation.ChannelWeb))
	for _, c := range []string{evaluation.ChannelAPI, evaluation.ChannelOnBehalf, evaluation.ChannelSlack} {
		require.False(t, p.AllowsChannel(c), c)
	}
	p.Channels = evaluation.AllChannels
	require.False(t, p.AllowsChannel(evaluation.ChannelSlack))
	p.RequirePasskey = false
	require.True(t, p.AllowsChannel(evaluation.ChannelSlack))
}
