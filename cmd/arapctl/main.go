// Command arapctl is the operator and integration CLI of arap.
//
// The database commands (clients, keys, audit, users, groups, attributes,
// callers) work on the database directly, like an operator's psql session,
// so the first API client can be created before any token exists. The
// requests, approvals and deliveries commands call the decision API; the mcp
// commands are an MCP client on the tasks extension. commands.go lists them
// all.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/omcp/arap/internal/version"
)

func main() {
	err := run(os.Args[1:], streams{out: os.Stdout, note: os.Stderr})
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, "arapctl:", err)
	var ue usageError
	if errors.As(err, &ue) {
		if ue.usage != "" {
			fmt.Fprintln(os.Stderr, ue.usage)
		}
		os.Exit(2)
	}
	var ee exitError
	if errors.As(err, &ee) {
		os.Exit(ee.code)
	}
	os.Exit(1)
}

// streams are where a command writes: its results to out, notes for the
// person running it (such as which database it found) to note.
type streams struct{ out, note io.Writer }

// usageError is a command line arapctl cannot run: main prints the problem
// in one line, then usage (the command's usage line), and exits 2.
type usageError struct{ msg, usage string }

func (e usageError) Error() string { return e.msg }

// exitError ends arapctl with a status other than 1 (see the mcp commands).
type exitError struct {
	code int
	msg  string
}

func (e exitError) Error() string { return e.msg }

// isHelp reports whether arg asks for help.
func isHelp(arg string) bool {
	switch arg {
	case "-h", "-help", "--help", "help":
		return true
	}
	return false
}

// run runs one arapctl command line. Help goes to s.out and is not an error.
func run(args []string, s streams) error {
	if len(args) == 0 {
		return usageError{"missing command", commandList()}
	}
	if args[0] == "--version" || args[0] == "-version" || args[0] == "version" {
		_, err := fmt.Fprintln(s.out, version.Get().String("arapctl"))
		return err
	}
	if isHelp(args[0]) {
		if len(args) == 1 {
			_, err := io.WriteString(s.out, overview())
			return err
		}
		args = append(args[1:], "--help") // arapctl help requests approve
	}
	group := args[0]
	if !commandGroups[group] {
		return usageError{fmt.Sprintf("unknown command %q", group), commandList()}
	}
	c, rest := lookup(args)
	if c == nil {
		if len(args) == 1 {
			return usageError{group + " needs a subcommand", groupUsage(group)}
		}
		if isHelp(args[1]) {
			_, err := io.WriteString(s.out, groupHelp(group))
			return err
		}
		return usageError{fmt.Sprintf("unknown command %q", group+" "+args[1]), groupUsage(group)}
	}
	err := c.run(rest, s)
	var ue usageError
	if errors.As(err, &ue) && ue.usage == "" {
		return usageError{c.name + ": " + ue.msg, c.usageLine()}
	}
	return err
}

// lookup finds the command args name (the longest match: "clients secret
// rotate" before "clients secret") and returns the arguments after it.
func lookup(args []string) (*command, []string) {
	for n := min(len(args), 3); n > 0; n-- {
		if c := commandNamed(strings.Join(args[:n], " ")); c != nil {
			return c, args[n:]
		}
	}
	return nil, nil
}

// run parses the command's flags and positional arguments and runs it.
func (c *command) run(args []string, s streams) error {
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors and help are printed here, once
	act := c.flags(fs)
	pos, err := parse(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		_, err := io.WriteString(s.out, c.help(fs))
		return err
	}
	if err != nil {
		return usageError{msg: err.Error()}
	}
	if c.nargs >= 0 && len(pos) != c.nargs {
		return usageError{msg: c.countProblem(pos)}
	}
	if err := resolve(fs); err != nil {
		return usageError{msg: err.Error()}
	}
	return act(s, pos)
}

// countProblem says what is wrong with the number of positional arguments.
func (c *command) countProblem(pos []string) string {
	names := c.positional()
	if len(pos) < c.nargs {
		return "missing " + strings.Join(names[len(pos):], " ")
	}
	return fmt.Sprintf("unexpected argument %q", pos[c.nargs])
}

// parse parses flags that may come before or after positional arguments
// ("requests approve ID --reason R") and returns the positional ones.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, flagProblem(err)
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// flagProblem words the flag package's errors for a person.
func flagProblem(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return fmt.Errorf("no such flag: --%s", name)
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return fmt.Errorf("--%s needs a value", name)
	}
	return err
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }
