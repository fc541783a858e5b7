package evaluation_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/evaluation"
)

func TestWindows(t *testing.T) {
	p, err := evaluation.Parse("w.yaml", []byte(`version: 1
windows:
  office:
    days: [mon, tue, wed, thu, fri]
    from: "09:00"
    to: "17:30"
    timezone: Europe/Paris
  nightly:
    days: [mon, tue, wed, thu, fri, sat, sun]
    from: "00:00"
    to: "24:00"
rules:
  - name: open_office
    when: windows.office
    effect: allow
`))
	require.NoError(t, err)
	office := p.Windows["office"]
	paris, _ := time.LoadLocation("Europe/Paris")
	mon := time.Date(2026, 11, 30, 8, 59, 0, 0, paris) // a Monday
	require.False(t, office.Open(mon))
	require.True(t, office.Open(mon.Add(time.Minute)))
	require.True(t, office.Open(time.Date(2026, 11, 30, 17, 29, 59, 0, paris)))
	require.False(t, office.Open(time.Date(2026, 11, 30, 17, 30, 0, 0, paris)))
	require.False(t, office.Open(time.Date(2026, 12, 5, 12, 0, 0, 0, paris)), "Saturday")

	require.Equal(t, time.Date(2026, 11, 30, 9, 0, 0, 0, paris), office.NextChange(mon))
	require.Equal(t, time.Date(2026, 11, 30, 17, 30, 0, 0, paris), office.NextChange(mon.Add(time.Hour)))
	fri := time.Date(2026, 12, 4, 18, 0, 0, 0, paris)
	require.Equal(t, time.Date(2026, 12, 7, 9, 0, 0, 0, paris), office.NextChange(fri), "the weekend is skipped")
	require.True(t, p.Windows["nightly"].NextChange(mon).IsZero(), "an always-open window never changes")
	require.Equal(t, time.Date(2026, 11, 30, 9, 0, 0, 0, paris), p.NextWindowChange(mon))

	for _, bad := range []string{
		"days: [funday]\n    from: \"09:00\"\n    to: \"10:00\"",
		"days: [mon]\n    from: \"10:00\"\n    to: \"09:00\"",
		"days: [mon]\n    from: \"25:00\"\n    to: \"26:00\"",
		"days: [mon]\n    from: \"09:00\"\n    to: \"10:00\"\n    timezone: Mars/Olympus",
	} {
		_, err := evaluation.Parse("w.yaml", []byte("version: 1\nwindows:\n  w:\n    "+bad+"\nrules: []\n"))
		require.Error(t, err, bad)
		require.Contains(t, err.Error(), "w.yaml:4:", "errors point at the window")
	}
}

func TestApprovalPolicyErrors(t *testing.T) {
	doc := `version: 1
rules:
  - name: no_approvers
    match: {resource_id: a}
    effect: request
    approval: {quorum: 1}
  - name: humans_over_quorum
    match: {resource_id: b}
    effect: request
    approval: {quorum: 1, groups: [g], require_humans: 2}
  - name: machine_grant_forbidden
    match: {resource_id: c}
    effect: request
    approval:
      machines_may: [deny]
      resolvers:
        - name: auto
          when: "true"
          decision: approve
  - name: missing
    match: {resource_id: d}
    effect: request
  - name: human_kind
    match: {resource_id: e}
    effect: request
    approval: {kinds: [human]}
`
	_, err := evaluation.Parse("p.yaml", []byte(doc))
	require.Error(t, err)
	msg := err.Error()
	require.Contains(t, msg, `p.yaml:6: rule "no_approvers": approval names no one`)
	require.Contains(t, msg, `p.yaml:10: rule "humans_over_quorum": approval.require_humans`)
	require.Contains(t, msg, `p.yaml:17: rule "machine_grant_forbidden": resolver "auto" approves, but machines_may`)
	require.Contains(t, msg, `p.yaml:20: rule "missing": effect: request needs an approval section`)
	require.Contains(t, msg, `rule "human_kind": approval.kinds: "human" is not an API client kind`)
}
