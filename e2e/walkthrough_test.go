package e2e

import (
	"errors"
	"os"
	osexec "os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/npmtest"
)

// walkthroughDoc is the reviewer's walkthrough. Its console blocks are run
// and compared by TestWalkthrough; ARAP_UPDATE_DOCS=1 rewrites their expected
// output from a run instead (review the diff before committing it).
const walkthroughDoc = "../docs/walkthrough.md"

// A walkthrough step, from the document: set environment (an export line of
// an sh block), run a command (a "$ " line of a console block, its expected
// output the lines after it), decide in the browser, wait for the command
// running in the background, save or extend a file (the code block after a
// file or append directive), or restart `arapd dev` with the arguments of
// the `go run ./cmd/arapd dev` line of the sh block after a restart
// directive. HTML comments carry the directives a reader does not need to
// see.
type walkStep struct {
	kind       string // "env", "run", "browser", "wait", "file", "restart"
	text       string // the command, the export, the browser directive, the file's path, or dev's arguments
	background bool   // run: started and left running until the next wait
	window     bool   // run: depends on the change window (see below)
	from, to   int    // run: the expected output lines are doc[from:to]
	content    string // file: what to write
	append     bool   // file: added at its end
}

// devCommand is how the document starts `arapd dev`.
const devCommand = "go run ./cmd/arapd dev"

func parseWalkthrough(t *testing.T, doc []string) []walkStep {
	var steps []walkStep
	block, background, window := "", false, false
	var file *walkStep // the file or restart step of the block being read
	for i := 0; i < len(doc); i++ {
		line := doc[i]
		switch {
		case block == "" && strings.HasPrefix(line, "```"):
			block = strings.TrimPrefix(line, "```")
			if block == "" {
				block = "text"
			}
		case block != "" && line == "```":
			if block == "console" {
				background, window = false, false
			}
			if file != nil {
				require.False(t, file.kind == "restart" && file.text == "", "line %d: a restart directive's block has no %q line", i+1, devCommand)
				steps = append(steps, *file)
				file = nil
			}
			block = ""
		case block != "" && file != nil && file.kind == "file":
			file.content += line + "\n"
		case block == "sh" && file != nil && file.kind == "restart" && strings.HasPrefix(line, devCommand):
			file.text = strings.TrimSpace(strings.TrimPrefix(line, devCommand))
		case block == "sh" && strings.HasPrefix(line, "export "):
			steps = append(steps, walkStep{kind: "env", text: strings.TrimSpace(strings.SplitN(strings.TrimPrefix(line, "export "), "#", 2)[0])})
		case block == "console" && strings.HasPrefix(line, "$ "):
			s := walkStep{kind: "run", text: strings.TrimPrefix(line, "$ "), background: background, window: window, from: i + 1}
			j := i + 1
			for j < len(doc) && !strings.HasPrefix(doc[j], "$ ") && doc[j] != "```" {
				j++
			}
			s.to = j
			steps = append(steps, s)
			i = j - 1
		case block == "" && line == "<!-- background -->":
			background = true
		case block == "" && line == "<!-- change-window -->":
			window = true
		case block == "" && line == "<!-- wait -->":
			steps = append(steps, walkStep{kind: "wait"})
		case block == "" && (strings.HasPrefix(line, "<!-- file: ") || strings.HasPrefix(line, "<!-- append: ")):
			verb, path, _ := strings.Cut(strings.TrimSuffix(strings.TrimPrefix(line, "<!-- "), " -->"), ": ")
			file = &walkStep{kind: "file", text: path, append: verb == "append"}
		case block == "" && line == "<!-- restart -->":
			file = &walkStep{kind: "restart"}
		case block == "" && strings.HasPrefix(line, "<!-- browser: "):
			steps = append(steps, walkStep{kind: "browser", text: strings.TrimSuffix(strings.TrimPrefix(line, "<!-- browser: "), " -->")})
		}
	}
	require.NotEmpty(t, steps)
	return steps
}

var walkMasks = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`tsk_[A-Z0-9]{10,}`), "tsk_…"},
	{regexp.MustCompile(`arq_[A-Z0-9]{10,}`), "arq_…"},
	{regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)`), "<time>"},
}

// useNPMPackages lets npx, run by the upstreams file the walkthrough
// writes, find the pinned MCP server it names without a network: installed
// once into the test's npm cache (internal/npmtest), linked as node_modules
// of the walkthrough's directory, where npx looks first (a package of the
// exact version asked for in the local tree is run as it is). A reader's
// `npx -y` downloads it instead. Without npm the test skips from here,
// unless ARAP_REQUIRE_NPM is set.
func useNPMPackages(t *testing.T, work, upstreams string) {
	t.Helper()
	raw, err := os.ReadFile(upstreams)
	require.NoError(t, err)
	require.Contains(t, string(raw), npmtest.FilesystemServer, "the walkthrough runs the pinned filesystem server")
	dir := npmtest.Package(t, npmtest.FilesystemServer)
	if _, err := os.Lstat(filepath.Join(work, "node_modules")); err == nil {
		return
	}
	require.NoError(t, os.Symlink(filepath.Join(dir, "node_modules"), filepath.Join(work, "node_modules")))
}

func maskWalk(out string) []string {
	for _, m := range walkMasks {
		out = m.re.ReplaceAllString(out, m.with)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	for i := range lines {
		lines[i] = strings.TrimRight(lines[i], " ")
	}
	if len(lines) == 1 && lines[0] == "" {
		return nil
	}
	return lines
}

// TestWalkthrough runs docs/walkthrough.md: every command as written, in
// order, against `arapd dev`, with the browser steps done in headless
// Chromium, and compares each command's output with the document.
func TestWalkthrough(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	// The commands run in work, as a reader's run in the directory where
	// `arapd dev` runs: its data dir is work/.arap-dev, where arapctl's
	// database commands find the database without DATABASE_URL.
	work := t.TempDir()
	dbURL, dataDir := dbtest.URL(t), filepath.Join(work, ".arap-dev")
	d := startDevAt(t, dbURL, dataDir)
	base := d.p.url()
	mcpAddr, _ := d.p.waitLog("mcp front-end started", time.Second)["addr"].(string)

	raw, err := os.ReadFile(walkthroughDoc)
	require.NoError(t, err)
	doc := strings.Split(string(raw), "\n")
	steps := parseWalkthrough(t, doc)
	update := os.Getenv("ARAP_UPDATE_DOCS") != ""

	// bin/arapctl is there, as the document builds it; the MCP URL is the
	// test's, since dev runs on free ports.
	require.NoError(t, os.MkdirAll(filepath.Join(work, "bin"), 0o755))
	require.NoError(t, os.Symlink(filepath.Join(binDir, "arapctl"), filepath.Join(work, "bin", "arapctl")))
	env := append([]string{}, d.env...)

	type result struct {
		step walkStep
		out  []string
	}
	var results []result
	type started struct {
		step walkStep
		bg   *background
	}
	var running []started
	check := func(s walkStep, out string) {
		got := maskWalk(out)
		results = append(results, result{s, got})
		if update {
			return
		}
		if s.window && time.Now().UTC().Hour() == 23 {
			t.Logf("skipping the comparison of %q: the change window is closed now", s.text)
			return
		}
		want := doc[s.from:s.to]
		for len(want) > 0 && want[len(want)-1] == "" {
			want = want[:len(want)-1]
		}
		require.Equal(t, strings.Join(want, "\n"), strings.Join(got, "\n"), "output of `%s` differs from %s", s.text, walkthroughDoc)
	}
	signedIn := ""
	start := time.Now()
	for _, s := range steps {
		t.Logf("%6.1fs %s %s", time.Since(start).Seconds(), s.kind, s.text)
		switch s.kind {
		case "env":
			k, v, ok := strings.Cut(s.text, "=")
			require.True(t, ok, "export %s", s.text)
			env = append(env, k+"="+v)
		case "run":
			cmd := osexec.Command("sh", "-c", s.text)
			cmd.Dir = work
			cmd.Env = append(withoutDatabaseURL(os.Environ()), env...)
			b := startBackground(t, cmd)
			if s.background {
				b.waitOutput(t, "working") // the task exists before anyone decides
				running = append(running, started{s, b})
				continue
			}
			_, out := b.exit(t)
			check(s, out)
		case "browser":
			f := strings.SplitN(s.text, " ", 4)
			require.Len(t, f, 4, "browser directive %q: want USER DECISION TOOL TEXT", s.text)
			if signedIn != f[0] {
				if signedIn != "" {
					signOut(t, ctx)
				}
				signIn(t, ctx, base, f[0])
				signedIn = f[0]
			}
			decideInBrowser(t, ctx, base, f[2], f[3], f[1], "walkthrough: "+f[1])
		case "file":
			flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
			if s.append {
				flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
			}
			f, err := os.OpenFile(filepath.Join(work, s.text), flags, 0o600)
			require.NoError(t, err)
			_, err = f.WriteString(s.content)
			require.NoError(t, errors.Join(err, f.Close()))
		case "restart":
			require.Empty(t, running, "a restart while a command runs in the background")
			args := strings.Fields(s.text)
			if i := slices.Index(args, "--upstreams"); i >= 0 && i+1 < len(args) {
				useNPMPackages(t, work, filepath.Join(work, args[i+1]))
			}
			// What a reader's Ctrl-C does; then dev again on the same data
			// dir and addresses (the browser and the client keep theirs).
			d.p.signal(syscall.SIGINT)
			require.Equal(t, 0, d.p.wait(60*time.Second), "arapd dev stops")
			d.p = startArapdIn(t, work, []string{"DATABASE_URL=" + dbURL}, append([]string{"dev",
				"--addr", strings.TrimPrefix(base, "http://"), "--mcp-addr", mcpAddr, "--data-dir", dataDir}, args...)...)
			m := d.p.waitLog("mcp front-end started", 60*time.Second)
			require.Equal(t, mcpAddr, m["addr"])
			if slices.Contains(args, "--upstreams") {
				// It connects its upstreams after it starts serving; a
				// reader would not type that fast.
				d.p.waitLog("upstream connected", 90*time.Second)
			}
		case "wait":
			for _, r := range running {
				_, out := r.bg.exit(t)
				check(r.step, out)
			}
			running = nil
		}
	}
	require.Empty(t, running, "a background command has no <!-- wait --> after it")

	if update {
		// Replace each command's expected lines, from the end of the
		// document so that earlier line numbers stay valid.
		sort.Slice(results, func(i, j int) bool { return results[i].step.from < results[j].step.from })
		for i := len(results) - 1; i >= 0; i-- {
			r := results[i]
			doc = append(doc[:r.step.from], append(r.out, doc[r.step.to:]...)...)
		}
		require.NoError(t, os.WriteFile(walkthroughDoc, []byte(strings.Join(doc, "\n")), 0o644))
		t.Logf("rewrote %s", walkthroughDoc)
	}
}
