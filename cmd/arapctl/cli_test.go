package main

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// mainEnv makes the test binary run arapctl's main instead of the tests
// (see TestMain), so that exit statuses and standard error can be checked.
const mainEnv = "ARAPCTL_TEST_RUN_MAIN"

// arapctlMain runs arapctl's main in a child process and returns its exit
// status, standard output and standard error.
func arapctlMain(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), mainEnv+"=1"), env...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil {
		require.ErrorAs(t, err, &ee)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errOut.String()
}

// flagsOf returns the flags a command defines.
func flagsOf(c *command) map[string]bool {
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	c.flags(fs)
	names := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { names[f.Name] = true })
	return names
}

// TestEveryCommandHasItsOwnFlags: each command's usage line names exactly
// the flags it defines (besides the connection flags every command of its
// kind has), so `requests list` does not offer --reason.
func TestEveryCommandHasItsOwnFlags(t *testing.T) {
	common := map[string]bool{"database-url-file": true, "url": true, "token-file": true, "state": true, "config": true,
		// The MCP client's OAuth sign-in, for every mcp command.
		"client-id": true, "client-secret-file": true, "client-metadata-url": true, "redirect-url": true, "oauth-store": true}
	named := regexp.MustCompile(`--([a-z-]+)`)
	for _, c := range commands {
		defined := flagsOf(c)
		inUsage := map[string]bool{}
		for _, m := range named.FindAllStringSubmatch(c.args, -1) {
			inUsage[m[1]] = true
			require.True(t, defined[m[1]], "%s: the usage line names --%s, which it does not define", c.name, m[1])
		}
		for f := range defined {
			require.True(t, inUsage[f] || common[f], "%s defines --%s, which its usage line does not name", c.name, f)
		}
	}
	require.NotContains(t, flagsOf(commandNamed("requests list")), "reason")
	require.NotContains(t, flagsOf(commandNamed("requests deny")), "until")
	require.Contains(t, flagsOf(commandNamed("requests approve")), "until")
	require.NotContains(t, flagsOf(commandNamed("mcp get")), "arg")
}

// TestHelp: --help (or -h, or arapctl help ...) on any command prints that
// command's usage and flags and is not an error; on a group, the group's
// commands; alone, the overview.
func TestHelp(t *testing.T) {
	for _, c := range commands {
		for _, args := range [][]string{
			append(strings.Fields(c.name), "--help"),
			append(strings.Fields(c.name), "-h"),
			append([]string{"help"}, strings.Fields(c.name)...),
		} {
			out, err := ctl(t, args...)
			require.NoError(t, err, "%v", args)
			require.True(t, strings.HasPrefix(out, c.usageLine()+"\n"), "%v:\n%s", args, out)
		}
	}
	out, err := ctl(t, "requests", "list", "--help")
	require.NoError(t, err)
	require.Contains(t, out, "--status")
	require.NotContains(t, out, "--reason", "only the flags of requests list")
	out, err = ctl(t, "requests", "approve", "arq_1", "--reason", "r", "--help")
	require.NoError(t, err, "help after arguments still helps, and runs nothing")
	require.Contains(t, out, "--until")

	for _, args := range [][]string{{"mcp", "--help"}, {"mcp", "-h"}, {"mcp", "help"}, {"help", "mcp"}} {
		out, err := ctl(t, args...)
		require.NoError(t, err, "%v", args)
		require.True(t, strings.HasPrefix(out, "usage: arapctl mcp <subcommand>"), out)
		for _, sub := range []string{"mcp call TOOL", "mcp get TASK", "mcp cancel TASK", "mcp wait"} {
			require.Contains(t, out, sub)
		}
		require.NotContains(t, out, "clients create")
	}
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		out, err := ctl(t, args...)
		require.NoError(t, err)
		for _, c := range commands {
			require.Contains(t, out, "  "+c.name, "the overview lists every command")
		}
	}
}

// TestUsageErrors: a command line arapctl cannot run is a usage error that
// names the problem and carries the command's usage line.
func TestUsageErrors(t *testing.T) {
	t.Setenv("ARAP_TOKEN", "t")
	t.Setenv("ARAP_MCP_TOKEN", "t")
	for _, tc := range []struct {
		args       []string
		msg, usage string
	}{
		{[]string{"requests", "list", "--reason", "x"}, "requests list: no such flag: --reason", commandNamed("requests list").usageLine()},
		{[]string{"requests", "approve"}, "requests approve: missing ID", commandNamed("requests approve").usageLine()},
		{[]string{"requests", "approve", "a", "b"}, `requests approve: unexpected argument "b"`, commandNamed("requests approve").usageLine()},
		{[]string{"groups", "add", "treasury"}, "groups add: missing USER", commandNamed("groups add").usageLine()},
		{[]string{"requests", "approve", "a", "--reason"}, "requests approve: --reason needs a value", commandNamed("requests approve").usageLine()},
		{[]string{"requests", "list", "--limit", "many"}, `requests list: invalid value "many" for flag -limit: parse error`, commandNamed("requests list").usageLine()},
		{[]string{"requests", "approve", "a", "--until", "tomorrow"}, `requests approve: --until "tomorrow" is not an RFC 3339 time such as 2026-12-01T17:00:00Z`, commandNamed("requests approve").usageLine()},
		{[]string{"mcp", "call", "wire_transfer", "--arg", "amount"}, `mcp call: --arg "amount": want name=value`, commandNamed("mcp call").usageLine()},
		{[]string{"mcp"}, "mcp needs a subcommand", groupUsage("mcp")},
		{[]string{"mcp", "frob"}, `unknown command "mcp frob"`, groupUsage("mcp")},
		{[]string{"clients", "secret"}, `unknown command "clients secret"`, groupUsage("clients")},
		{[]string{"frobnicate", "now"}, `unknown command "frobnicate"`, commandList()},
		{nil, "missing command", commandList()},
	} {
		_, err := ctl(t, tc.args...)
		var ue usageError
		require.ErrorAs(t, err, &ue, "%v", tc.args)
		require.Equal(t, tc.msg, ue.msg, "%v", tc.args)
		require.Equal(t, tc.usage, ue.usage, "%v", tc.args)
	}
	t.Setenv("ARAP_TOKEN", "")
	_, err := ctl(t, "requests", "list")
	require.EqualError(t, err, "requests list: a token is required: ARAP_TOKEN or --token-file (ARAP_TOKEN_FILE)")
}

// TestExitStatus runs arapctl's main: help goes to standard output with
// status 0; a usage error prints one line naming the problem and the
// command's usage line (not the overview) on standard error, status 2.
func TestExitStatus(t *testing.T) {
	code, out, errOut := arapctlMain(t, nil, "requests", "list", "-h")
	require.Equal(t, 0, code)
	require.True(t, strings.HasPrefix(out, "usage: arapctl requests list "), out)
	require.Empty(t, errOut)

	code, out, errOut = arapctlMain(t, nil, "mcp", "--help")
	require.Equal(t, 0, code)
	require.Contains(t, out, "mcp call TOOL")
	require.Empty(t, errOut)

	code, out, errOut = arapctlMain(t, nil, "requests", "list", "--reason", "x")
	require.Equal(t, 2, code)
	require.Empty(t, out)
	require.Equal(t, "arapctl: requests list: no such flag: --reason\n"+commandNamed("requests list").usageLine()+"\n", errOut)

	code, _, errOut = arapctlMain(t, nil, "frobnicate")
	require.Equal(t, 2, code)
	require.Len(t, strings.Split(strings.TrimSpace(errOut), "\n"), 2, errOut)

	code, _, errOut = arapctlMain(t, []string{"DATABASE_URL=postgres://nobody@127.0.0.1:1/none?connect_timeout=2"}, "clients", "list")
	require.Equal(t, 1, code, "an error that is not about usage")
	require.Contains(t, errOut, "arapctl: cannot reach the database: ")
	require.NotContains(t, errOut, "usage:")
}

// TestVersion: arapctl --version prints the build on standard output.
func TestVersion(t *testing.T) {
	code, out, errOut := arapctlMain(t, nil, "--version")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `^arapctl \S+ \(revision \S+, go[0-9.]+\S*\)\n$`, out)
}

// TestConnectionSettings: the connection settings come from a flag, an
// ARAP_* variable or the config file, in that order; tokens never from a
// flag; a token in a variable and a file at once is refused naming both.
func TestConnectionSettings(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("t0k\n"), 0o600))
	conf := filepath.Join(dir, "arapctl.conf")
	require.NoError(t, os.WriteFile(conf, []byte("url http://127.0.0.1:9/from-file\ntoken-file "+tokenFile+"\nmcp-url http://127.0.0.1:9/mcp-from-file\nmcp-token-file "+tokenFile+"\ndatabase-url-file /nonexistent\n"), 0o600))
	t.Setenv("ARAP_TOKEN", "")
	t.Setenv("ARAP_URL", "")
	t.Setenv("ARAP_CONFIG", conf)

	_, err := ctl(t, "requests", "list")
	require.ErrorContains(t, err, "127.0.0.1:9/from-file", "url and token-file from the config file")
	t.Setenv("ARAP_URL", "http://127.0.0.1:9/from-env")
	_, err = ctl(t, "requests", "list")
	require.ErrorContains(t, err, "127.0.0.1:9/from-env", "the variable wins over the file")
	_, err = ctl(t, "requests", "list", "--url", "http://127.0.0.1:9/from-flag")
	require.ErrorContains(t, err, "127.0.0.1:9/from-flag", "the flag wins over the variable")
	_, err = ctl(t, "mcp", "get", "task-1", "--url", "http://127.0.0.1:9/mcp-flag")
	require.ErrorContains(t, err, "127.0.0.1:9/mcp-flag")
	t.Setenv("ARAP_MCP_URL", "")
	_, err = ctl(t, "mcp", "get", "task-1")
	require.ErrorContains(t, err, "127.0.0.1:9/mcp-from-file", "the mcp commands read mcp-url, not url")

	_, err = ctl(t, "requests", "list", "--token", "t")
	require.EqualError(t, err, "requests list: no such flag: --token")
	t.Setenv("ARAP_TOKEN", "t")
	_, err = ctl(t, "requests", "list")
	require.EqualError(t, err, "requests list: the API token is set both in ARAP_TOKEN and as a file (--token-file, ARAP_TOKEN_FILE or the config file's token-file); set one")

	require.NoError(t, os.WriteFile(conf, []byte("url http://127.0.0.1:9\nurll typo\n"), 0o600))
	_, err = ctl(t, "requests", "list")
	require.EqualError(t, err, "requests list: "+conf+`:2: unknown key "urll"`)

	out, err := ctl(t, "requests", "list", "--help")
	require.NoError(t, err)
	require.Contains(t, out, "backend URL (default http://127.0.0.1:8480); env ARAP_URL; config key url")
	require.Contains(t, out, "file holding the API token (instead of ARAP_TOKEN); env ARAP_TOKEN_FILE;\n      config key token-file\n")
	out, err = ctl(t, "mcp", "get", "--help")
	require.NoError(t, err)
	require.Contains(t, out, "env ARAP_MCP_URL; config\n      key mcp-url\n")
}
