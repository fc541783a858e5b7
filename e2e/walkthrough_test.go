package e2e

import (
	"os"
	osexec "os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
)

// walkthroughDoc is the reviewer's walkthrough. Its console blocks are run
// and compared by TestWalkthrough; ARAP_UPDATE_DOCS=1 rewrites their expected
// output from a run instead (review the diff before committing it).
const walkthroughDoc = "../docs/walkthrough.md"

// A walkthrough step, from the document: set environment (an export line of
// an sh block), run a command (a "$ " line of a console block, its expected
// output the lines after it), decide in the browser, or wait for the
// command running in the background. HTML comments carry the directives a
// reader does not need to see.
type walkStep struct {
	kind       string // "env", "run", "browser", "wait"
	text       string // the command, the export, or the browser directive
	background bool   // run: started and left running until the next wait
	window     bool   // run: depends on the change window (see below)
	from, to   int    // run: the expected output lines are doc[from:to]
}

func parseWalkthrough(t *testing.T, doc []string) []walkStep {
	var steps []walkStep
	block, background, window := "", false, false
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
			block = ""
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
	d := startDevAt(t, dbtest.URL(t), filepath.Join(work, ".arap-dev"))
	base := d.p.url()

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
