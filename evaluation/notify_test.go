package evaluation_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/evaluation"
)

// TestNotifySection: a rule's notify section is compiled into the approval
// policy stored with each request; without one, e-mail only (as before).
func TestNotifySection(t *testing.T) {
	doc := `version: 1
rules:
  - name: ticketed
    match: {action: a}
    effect: request
    approval: {users: [bob]}
    notify:
      channels: [email, webhook]
      webhooks: [servicenow, jira-cloud]
  - name: plain
    match: {action: b}
    effect: request
    approval: {users: [bob]}
  - name: silent
    match: {action: c}
    effect: request
    approval: {users: [bob]}
    notify: {channels: []}
`
	p, err := evaluation.Parse("p.yaml", []byte(doc))
	require.NoError(t, err)
	r, _ := p.Rule("ticketed")
	require.Equal(t, &evaluation.NotifyPolicy{Channels: []string{"email", "webhook"}, Webhooks: []string{"servicenow", "jira-cloud"}}, r.Approval.Notify)
	require.True(t, r.Approval.Notify.Uses(evaluation.NotifyWebhook))
	r, _ = p.Rule("plain")
	require.Nil(t, r.Approval.Notify)
	require.True(t, r.Approval.Notify.Uses(evaluation.NotifyEmail))
	require.False(t, r.Approval.Notify.Uses(evaluation.NotifyWebhook))
	r, _ = p.Rule("silent")
	require.False(t, r.Approval.Notify.Uses(evaluation.NotifyEmail))

	bad := `version: 1
rules:
  - name: typo
    match: {action: a}
    effect: request
    approval: {users: [bob]}
    notify:
      channels:
        - email
        - pager
        - email
  - name: no_target
    match: {action: b}
    effect: request
    approval: {users: [bob]}
    notify:
      channels: [webhook]
  - name: stray_target
    match: {action: c}
    effect: request
    approval: {users: [bob]}
    notify:
      channels: [email]
      webhooks: [Bad/Name]
  - name: unknown_key
    match: {action: d}
    effect: request
    approval: {users: [bob]}
    notify: {chanels: [email]}
`
	_, err = evaluation.Parse("p.yaml", []byte(bad))
	require.ErrorContains(t, err, `p.yaml:29: unknown notify field "chanels" (known: channels, webhooks)`)
	bad = bad[:len(bad)-len("  - name: unknown_key\n    match: {action: d}\n    effect: request\n    approval: {users: [bob]}\n    notify: {chanels: [email]}\n")]
	_, err = evaluation.Parse("p.yaml", []byte(bad))
	var perr *evaluation.Error
	require.ErrorAs(t, err, &perr)
	msg := err.Error()
	require.Contains(t, msg, `p.yaml:10: rule "typo": notify.channels: unknown channel "pager" (known: email, slack, webhook)`)
	require.Contains(t, msg, `p.yaml:11: rule "typo": notify.channels: "email" is listed twice`)
	require.Contains(t, msg, `p.yaml:17: rule "no_target": notify.channels has webhook, but notify.webhooks names no target`)
	require.Contains(t, msg, `p.yaml:24: rule "stray_target": notify.webhooks: "Bad/Name" is not a webhook target name`)
	require.Contains(t, msg, `p.yaml:23: rule "stray_target": notify.webhooks names targets, but notify.channels does not have webhook`)
	require.Len(t, perr.Problems, 5)

	_, err = evaluation.Parse("p.yaml", []byte(`version: 1
rules:
  - name: allow
    match: {action: a}
    effect: allow
    notify: {channels: [email]}
`))
	require.ErrorContains(t, err, "approval and notify apply only to effect: request")
}
