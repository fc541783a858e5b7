// Command skips reads `go test -json` on its standard input and prints what
// go test prints without -v: each package's result line, and the whole
// output of every test that failed (or never finished in a package that
// failed). A skipped test is not a pass: the run fails when a test skipped
// that the allowed-skips file does not list with its reason, and every skip
// the file allows gets a line of its own, so a CI log says what did not run.
//
//	go test -json ./... | go run .ci/skips.go [-show REGEXP] .ci/allowed-skips
//
// -show also prints, as they come, the test output lines matching REGEXP
// (what a -v step shows of its tests). The exit status is 1 when a test or
// a package failed, when a skip is not allowed, or when no package
// reported; otherwise 0.
//
// The allowed-skips file has one skip a line: the package (its import path
// without the module's), the test's name as go test reports it, and text
// its skip message contains; # starts a comment.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
)

func main() {
	show := flag.String("show", "", "also print the test output lines matching this regular expression")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: go test -json ... | skips [-show REGEXP] ALLOWED-SKIPS")
		os.Exit(2)
	}
	var re *regexp.Regexp
	if isSet("show") {
		var err error
		if re, err = regexp.Compile(*show); err != nil {
			fmt.Fprintln(os.Stderr, "skips: -show:", err)
			os.Exit(2)
		}
	}
	module, err := modulePath("go.mod")
	if err == nil {
		var allowed []allowance
		if allowed, err = readAllowed(flag.Arg(0)); err == nil {
			if !check(os.Stdin, os.Stdout, module, allowed, re, flag.Arg(0)) {
				os.Exit(1)
			}
			return
		}
	}
	fmt.Fprintln(os.Stderr, "skips:", err)
	os.Exit(2)
}

// isSet reports whether flag name was given (an empty -show shows all).
func isSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// allowance is one line of the allowed-skips file.
type allowance struct {
	pkg, test, reason string
	line              int
}

func readAllowed(path string) ([]allowance, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var list []allowance
	for i, l := range strings.Split(string(raw), "\n") {
		if l, _, _ = strings.Cut(l, "#"); strings.TrimSpace(l) == "" {
			continue
		}
		f := strings.Fields(l)
		if len(f) < 3 {
			return nil, fmt.Errorf("%s:%d: want: package test reason", path, i+1)
		}
		reason := strings.TrimSpace(strings.SplitN(strings.TrimSpace(l), " ", 3)[2])
		list = append(list, allowance{pkg: f[0], test: f[1], reason: strings.Join(strings.Fields(reason), " "), line: i + 1})
	}
	return list, nil
}

func modulePath(gomod string) (string, error) {
	raw, err := os.ReadFile(gomod)
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if m, ok := strings.CutPrefix(strings.TrimSpace(l), "module "); ok {
			return strings.Trim(strings.TrimSpace(m), `"`), nil
		}
	}
	return "", errors.New(gomod + ": no module line")
}

// event is one line of go test -json (cmd/test2json), build events
// included.
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output, build-fail
	Test       string
	Output     string
}

// check reads the events of in, writes the readable log to out, and
// reports whether the run passed with only allowed skips.
func check(in io.Reader, out io.Writer, module string, allowed []allowance, show *regexp.Regexp, allowedName string) bool {
	type key struct{ pkg, test string }
	pending := map[key][]string{} // the output of tests not yet finished
	var order []key               // in the order they started, to flush
	ok, reported := true, false
	var skipped, refused []string
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			fmt.Fprintln(out, sc.Text()) // not an event: go's own words
			continue
		}
		switch e.Action {
		case "build-output":
			fmt.Fprint(out, e.Output)
			continue
		case "build-fail": // its package fails too
			continue
		}
		k := key{e.Package, e.Test}
		if e.Test == "" { // the package's own lines and result
			switch e.Action {
			case "output":
				if strings.TrimSpace(e.Output) != "PASS" {
					fmt.Fprint(out, e.Output)
				}
			case "fail":
				ok, reported = false, true
				for _, k := range order { // a panic or a timeout: who was running
					if lines, running := pending[k]; running && k.pkg == e.Package {
						fmt.Fprintf(out, "--- UNFINISHED: %s\n%s", k.test, strings.Join(lines, ""))
						delete(pending, k)
					}
				}
			case "pass", "skip":
				reported = true
			}
			continue
		}
		switch e.Action {
		case "run":
			if _, seen := pending[k]; !seen {
				pending[k] = nil
				order = append(order, k)
			}
		case "output":
			if show != nil && show.MatchString(strings.TrimRight(e.Output, "\n")) {
				fmt.Fprint(out, e.Output)
			}
			if !strings.HasPrefix(e.Output, "=== ") {
				pending[k] = append(pending[k], e.Output)
			}
		case "pass":
			delete(pending, k)
		case "fail": // its package fails too
			fmt.Fprint(out, strings.Join(pending[k], ""))
			delete(pending, k)
		case "skip":
			name := strings.TrimPrefix(strings.TrimPrefix(e.Package, module), "/") + "." + e.Test
			said := skipMessage(pending[k])
			delete(pending, k)
			if a := allowedSkip(allowed, module, e.Package, e.Test, said); a != nil {
				skipped = append(skipped, fmt.Sprintf("ci: SKIPPED (allowed by %s:%d) %s: %s", allowedName, a.line, name, reasonLine(said, a.reason)))
			} else {
				refused = append(refused, fmt.Sprintf("ci: SKIPPED, NOT ALLOWED by %s: %s:\n\t%s", allowedName, name, strings.Join(said, "\n\t")))
			}
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(out, "ci: reading go test -json:", err)
		return false
	}
	for _, l := range skipped {
		fmt.Fprintln(out, l)
	}
	for _, l := range refused {
		fmt.Fprintln(out, l)
	}
	if len(refused) > 0 {
		fmt.Fprintf(out, "ci: %d skips not allowed: run them, or list each in %s with its reason\n", len(refused), allowedName)
		ok = false
	}
	if !reported {
		fmt.Fprintln(out, "ci: no package reported a result")
		ok = false
	}
	return ok
}

// skipMessage is what a skipped test said: its output lines, trimmed,
// without the "--- SKIP" line.
func skipMessage(lines []string) []string {
	var said []string
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "--- SKIP") {
			said = append(said, l)
		}
	}
	return said
}

// allowedSkip is the allowance of a skip of test in pkg that said said,
// or nil. The reason is matched with runs of spaces as one.
func allowedSkip(allowed []allowance, module, pkg, test string, said []string) *allowance {
	flat := strings.Join(strings.Fields(strings.Join(said, " ")), " ")
	i := slices.IndexFunc(allowed, func(a allowance) bool {
		return module+"/"+a.pkg == pkg && a.test == test && strings.Contains(flat, a.reason)
	})
	if i < 0 {
		return nil
	}
	return &allowed[i]
}

// reasonLine is the line of said that holds reason (the first if none
// does alone).
func reasonLine(said []string, reason string) string {
	for _, l := range said {
		if strings.Contains(strings.Join(strings.Fields(l), " "), reason) {
			return l
		}
	}
	return strings.Join(said, " ")
}
