package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// TestProgramRuns builds this program and runs it against a real backend:
// it waits for the approval an ITSM system gives through the decision API,
// then runs the transfer on the allow of its re-evaluation.
func TestProgramRuns(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{})
	bin := filepath.Join(t.TempDir(), "pep")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run())

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(os.Environ(), "ARAP_URL="+env.URL, "ARAP_TOKEN="+dev.PEPToken)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := bufio.NewScanner(out)

	require.True(t, lines.Scan(), stderr.String())
	m := regexp.MustCompile(`^waiting for approval of (arq_\w+)$`).FindStringSubmatch(lines.Text())
	require.NotNil(t, m, lines.Text())
	itsm := &arapclient.Client{BaseURL: env.URL, Token: dev.ITSMToken}
	_, err = itsm.Decide(ctx, m[1], arapclient.Decision{Decision: arapclient.DecisionApprove, Reason: "CHG-1"})
	require.NoError(t, err)

	require.True(t, lines.Scan(), stderr.String())
	require.Equal(t, "allowed: the transfer runs now", lines.Text())
	require.NoError(t, cmd.Wait(), stderr.String())
}

// TestReadmeShowsThisProgram: README.md's "Write your own PEP" section
// shows exactly this program, so the README's code is code that runs.
func TestReadmeShowsThisProgram(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	program, err := os.ReadFile("main.go")
	require.NoError(t, err)
	const heading = "\n## Write your own PEP\n"
	i := strings.Index(string(readme), heading)
	if i < 0 {
		t.Fatal(`README.md has no "## Write your own PEP" section: it shows examples/pep/main.go`)
	}
	section := string(readme[i+len(heading):])
	if j := strings.Index(section, "\n## "); j >= 0 {
		section = section[:j]
	}
	m := regexp.MustCompile("(?s)```go\n(.*?)```\n").FindStringSubmatch(section)
	require.NotNil(t, m, "the section has a ```go block")
	require.Equal(t, string(program), m[1], "README.md's program is examples/pep/main.go")
}
