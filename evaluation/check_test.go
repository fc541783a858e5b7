package evaluation_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/evaluation"
)

var wireSchema = map[string]any{"type": "object", "properties": map[string]any{
	"to": map[string]any{"type": "string"}, "amount": map[string]any{"type": "number"},
	"memo": map[string]any{"type": "object", "properties": map[string]any{"text": map[string]any{"type": "string"}}}}}

// TestCheckFindsWhatNeverMatches (issue 38): a condition reading a path the
// evaluation request never has would silently never match at run time;
// Check names it, with its line: an argument the tool's schema does not
// have (a typo), a member of a value, an unknown window, a group or user
// the directory does not know, two rules on one template. A path the
// policy expects is accepted; a tool nobody offers is a note.
func TestCheckFindsWhatNeverMatches(t *testing.T) {
	p, err := evaluation.Parse("p.yaml", []byte(`version: 1
expects: [resource.properties.arguments.reference, subject.properties.department]
windows:
  office: {days: [mon, tue, wed, thu, fri], from: "09:00", to: "17:00", timezone: UTC}
rules:
  - name: typo
    match: {resource_id: wire_transfer}
    when: resource.properties.arguments.amout > 100
    effect: deny
  - name: fine
    match: {resource_id: wire_transfer}
    when: >-
      resource.properties.arguments.amount > 1 && has(resource.properties.arguments.memo.text) &&
      resource.properties.arguments.reference != "" && windows.office &&
      resource.properties.annotations.destructiveHint && subject.properties.department == "x" &&
      resource.properties.arguments.to.startsWith("acct-") && attributes.anything == 1 &&
      [1, 2].exists(x, x > resource.properties.arguments["amount"])
    effect: allow
  - name: deeper
    match: {resource_id: wire_transfer}
    when: resource.properties.arguments.to.country == "x" || windows.night || resource.properties.argument.amount > 0
    effect: request
    approval: {groups: [treasury, nosuchgroup], users: [nobody]}
  - name: same_template
    template: deeper
    match: {resource_id: other_tool}
    when: resource.properties.arguments.whatever == 1
    effect: request
    approval: {groups: [treasury]}
`))
	require.NoError(t, err)
	findings := evaluation.Check(p, evaluation.CheckEnv{Tools: map[string]map[string]any{"wire_transfer": wireSchema},
		Groups: map[string]bool{"treasury": true}, Users: map[string]bool{"bob": true}})
	var errs, notes []string
	for _, f := range findings {
		line := f.Message
		if f.Note {
			notes = append(notes, line)
		} else {
			errs = append(errs, line)
		}
	}
	all := strings.Join(errs, "\n")
	require.Contains(t, all, `rule "typo" when: resource.properties.arguments.amout: wire_transfer's input schema has no "amout" (it has: amount, memo, to)`)
	require.Contains(t, all, `resource.properties.arguments.to.country: resource.properties.arguments.to is a value, with no member "country"`)
	require.Contains(t, all, `windows.night: the policy's windows has no "night"`)
	require.Contains(t, all, `resource.properties.argument.amount: the resource's properties has no "argument"`)
	require.Contains(t, all, `group "nosuchgroup" is not in the directory`)
	require.Contains(t, all, `user "nobody" is not in the directory`)
	require.Contains(t, all, `template "deeper" is also rule "deeper"'s`)
	require.NotContains(t, all, `rule "fine"`, "every path the fine rule reads exists or is expected")
	require.Len(t, errs, 7, "%s", all)
	require.Len(t, notes, 1)
	require.Contains(t, notes[0], `names tool "other_tool"`)
	require.Equal(t, 8, findings[0].Line, "the line of the condition")
}

// TestDevPolicyChecks: the dev policy reads nothing that does not exist.
func TestDevPolicyChecks(t *testing.T) {
	raw, err := os.ReadFile("../internal/dev/policy.yaml")
	require.NoError(t, err)
	p, err := evaluation.Parse("policy.yaml", raw)
	require.NoError(t, err)
	for _, f := range evaluation.Check(p, evaluation.CheckEnv{}) {
		require.True(t, f.Note, "%d: %s", f.Line, f.Message)
	}
}
