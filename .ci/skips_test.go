package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The tests run the real go test -json on a small module whose tests pass,
// skip (plainly, in parallel, in a subtest), fail or panic as SKIPS_CASE
// says, so the checker reads what the toolchain writes, not a copy of it.

const demoModule = "example.com/skipsdemo"

const demoTests = `package demo

import (
	"os"
	"testing"
)

func TestPass(t *testing.T) {}

func TestSkipListed(t *testing.T) { t.Skip("listed:   the reason\nand a second line") }

func TestParallelSkip(t *testing.T) {
	t.Parallel()
	t.Log("logged before the skip")
	t.Skipf("parallel reason %d", 1)
}

func TestSub(t *testing.T) {
	t.Run("inner", func(t *testing.T) { t.Skip("inner reason") })
}

func TestCase(t *testing.T) {
	switch os.Getenv("SKIPS_CASE") {
	case "unlisted":
		t.Skip("nobody listed this one")
	case "fail":
		t.Log("what went wrong")
		t.Fail()
	case "panic":
		t.Log("about to panic")
		panic("boom")
	case "exit":
		t.Log("about to exit")
		os.Exit(3)
	}
}
`

const demoAllowed = `# package test reason
demo TestSkipListed listed: the reason   # runs of spaces count as one
demo TestParallelSkip parallel reason 1
demo TestSub/inner inner reason
`

// run runs go test -json on the demo module under SKIPS_CASE=c (tests
// replaced by src if not empty) and checks its output against allowed; it
// returns the verdict and what the checker printed.
func run(t *testing.T, c, src, allowed string) (bool, string) {
	t.Helper()
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module "+demoModule+"\n\ngo 1.26\n")
	if src == "" {
		src = demoTests
	}
	write("demo/demo_test.go", src)
	write("allowed-skips", allowed)
	list, err := readAllowed(filepath.Join(dir, "allowed-skips"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "test", "-json", "-count=1", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SKIPS_CASE="+c)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	ok := check(stdout, &out, demoModule, list, nil, "allowed-skips")
	_ = cmd.Wait() // its verdict is the checker's to give
	return ok, out.String()
}

func TestListedSkipsPass(t *testing.T) {
	t.Parallel()
	ok, out := run(t, "", "", demoAllowed)
	if !ok {
		t.Fatalf("a run with listed skips failed:\n%s", out)
	}
	for _, want := range []string{
		"ok  \t" + demoModule + "/demo",
		"ci: SKIPPED (allowed by allowed-skips:2) demo.TestSkipListed: demo_test.go:10: listed:   the reason",
		"ci: SKIPPED (allowed by allowed-skips:3) demo.TestParallelSkip: demo_test.go:15: parallel reason 1",
		"ci: SKIPPED (allowed by allowed-skips:4) demo.TestSub/inner: demo_test.go:19: inner reason",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	if strings.Contains(out, "=== RUN") || strings.Contains(out, "--- PASS") {
		t.Errorf("a passing run shows its tests:\n%s", out)
	}
}

func TestUnlistedSkipFails(t *testing.T) {
	t.Parallel()
	ok, out := run(t, "unlisted", "", demoAllowed)
	if ok {
		t.Fatalf("an unlisted skip passed:\n%s", out)
	}
	if !strings.Contains(out, "ci: SKIPPED, NOT ALLOWED by allowed-skips: demo.TestCase:\n\tdemo_test.go:25: nobody listed this one") {
		t.Errorf("the unlisted skip is not named with its reason:\n%s", out)
	}
}

// A skip listed for another reason, another test, or the same test of
// another package, is not allowed: the list says why a test may skip, not
// that a test of that name may.
func TestSkipListedOtherwiseFails(t *testing.T) {
	t.Parallel()
	for what, allowed := range map[string]string{
		"another reason":  strings.Replace(demoAllowed, "listed: the reason", "another reason", 1),
		"another package": strings.Replace(demoAllowed, "demo TestSkipListed", "other TestSkipListed", 1),
		"another test":    strings.Replace(demoAllowed, "demo TestSkipListed", "demo TestPass", 1),
	} {
		ok, out := run(t, "", "", allowed)
		if ok {
			t.Errorf("a skip listed for %s passed:\n%s", what, out)
		}
		if !strings.Contains(out, "NOT ALLOWED by allowed-skips: demo.TestSkipListed") {
			t.Errorf("%s: the skip is not named:\n%s", what, out)
		}
	}
}

func TestFailureIsShown(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, src, said string }{
		{"fail", "", "what went wrong"},
		{"panic", "", "about to panic"},
		{"exit", "", "--- UNFINISHED: TestCase\n    demo_test.go:33: about to exit"}, // the package fails with the test unfinished
		{"build", demoTests + "\nfunc broken() { undefined() }\n", "undefined: undefined"},
	} {
		ok, out := run(t, c.name, c.src, demoAllowed)
		if ok {
			t.Errorf("%s: the run passed:\n%s", c.name, out)
		}
		if !strings.Contains(out, c.said) || !strings.Contains(out, "FAIL") {
			t.Errorf("%s: %q and FAIL not shown:\n%s", c.name, c.said, out)
		}
	}
}

func TestNothingReportedFails(t *testing.T) {
	var out strings.Builder
	if check(strings.NewReader(""), &out, demoModule, nil, nil, "allowed-skips") {
		t.Fatal("an empty run passed")
	}
}
