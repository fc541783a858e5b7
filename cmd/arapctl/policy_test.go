package main

import (
	"flag"

	"github.com/omcp/arap/internal/config"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPolicyCheckAndTest (issue 38): policy check names a typo in a
// property path with its file and line and exits 1, passes the dev policy
// against the demo tools, and checks groups against a directory file;
// policy test prints each case, and a failing one's difference, and exits 1.
func TestPolicyCheckAndTest(t *testing.T) {
	dir := t.TempDir()
	seed, err := os.ReadFile("../../internal/dev/policy.yaml")
	require.NoError(t, err)
	out, err := ctl(t, "policy", "check", "../../internal/dev/policy.yaml")
	require.NoError(t, err)
	require.Contains(t, out, "9 rules, no problems")

	typo := filepath.Join(dir, "typo.yaml")
	require.NoError(t, os.WriteFile(typo, []byte(strings.Replace(string(seed), "arguments.amount > 25000", "arguments.amout > 25000", 1)), 0o600))
	out, err = ctl(t, "policy", "check", typo)
	require.Error(t, err)
	require.Contains(t, out, typo+`:52: rule "wire_transfer_large" when: resource.properties.arguments.amout: wire_transfer's input schema has no "amout" (it has: amount, to)`)

	people := filepath.Join(dir, "people.yaml")
	require.NoError(t, os.WriteFile(people, []byte("groups:\n  treasury: [bob, carol]\n"), 0o600))
	out, err = ctl(t, "policy", "check", "../../internal/dev/policy.yaml", "--directory", people)
	require.Error(t, err)
	require.Contains(t, out, `group "platform" is not in the directory`)

	broken := filepath.Join(dir, "broken.yaml")
	require.NoError(t, os.WriteFile(broken, []byte("version: 1\nrules:\n  - name: x\n    when: resource.id ==\n    effect: allow\n"), 0o600))
	out, err = ctl(t, "policy", "check", broken)
	require.Error(t, err)
	require.Contains(t, out, broken+":4:")

	out, err = ctl(t, "policy", "test", "../../internal/dev/policy.yaml", "../../internal/dev/policy-cases.yaml")
	require.NoError(t, err, out)
	require.Contains(t, out, "13 cases, 13 passed, 0 failed")
	cases := filepath.Join(dir, "cases.yaml")
	require.NoError(t, os.WriteFile(cases, []byte(`cases:
  - name: small transfers need approval
    subject: alice
    tool: wire_transfer
    arguments: {to: a, amount: 100}
    expect: {decision: request, groups: [treasury]}
`), 0o600))
	out, err = ctl(t, "policy", "test", "../../internal/dev/policy.yaml", cases)
	require.Error(t, err)
	require.Contains(t, out, "FAIL small transfers need approval ("+cases+":2)\n     decision: want request, got allow (rule wire_transfer_small)\n     groups: want [treasury], got []")
	require.Contains(t, out, "1 cases, 0 passed, 1 failed")
}

// TestDevMasterKey (issue 38): in arapd dev's directory, with DATABASE_URL
// unset, the commands that need the master key use arapd dev's; elsewhere
// the error names where it would be.
func TestDevMasterKey(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	t.Setenv("DATABASE_URL", "")
	t.Setenv("ARAP_DATABASE_URL", "")
	t.Setenv("ARAP_MASTER_KEY", "")
	key := masterKeyFlagFor(t)
	_, err := readMasterKey(key)
	require.ErrorContains(t, err, ".arap-dev/master.key")
	require.NoError(t, os.MkdirAll(".arap-dev", 0o700))
	require.NoError(t, os.WriteFile(".arap-dev/master.key", []byte("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n"), 0o600))
	got, err := readMasterKey(key)
	require.NoError(t, err)
	require.Equal(t, byte(31), got[31])
	require.NoError(t, os.Chmod(".arap-dev/master.key", 0o644))
	_, err = readMasterKey(key)
	require.ErrorContains(t, err, "only you can read")
}

// masterKeyFlagFor is the master key setting, parsed from the environment.
func masterKeyFlagFor(t *testing.T) *config.Secret {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	key := masterKeyFlag(fs)
	require.NoError(t, fs.Parse(nil))
	return key
}
