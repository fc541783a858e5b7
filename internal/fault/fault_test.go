package fault

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	require.Equal(t, map[string]float64{"pep.after-claim": 1, "pep.after-invoke": 0.25}, parse(" pep.after-claim , pep.after-invoke@0.25,"))
	all := parse("*@0.5,pep.after-claim")
	require.Len(t, all, len(Names))
	require.Equal(t, 1.0, all["pep.after-claim"], "a later entry overrides the wildcard")
	require.Equal(t, 0.5, all["notify.after-send"])
}

// TestNamesAreEveryPoint keeps Names (what "*" arms and a chaos run reports
// on) equal to the points the code reaches.
func TestNamesAreEveryPoint(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	call := regexp.MustCompile(`fault\.Point\("([^"]+)"\)`)
	var found []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		for _, m := range call.FindAllSubmatch(b, -1) {
			found = append(found, string(m[1]))
		}
		return err
	})
	require.NoError(t, err)
	slices.Sort(found)
	want := slices.Clone(Names)
	slices.Sort(want)
	require.Equal(t, want, slices.Compact(found))
}

// TestPointKills runs this test binary as a child that reaches a point armed
// with a probability until it dies: killed by SIGKILL, after saying where.
func TestPointKills(t *testing.T) {
	if os.Getenv("FAULT_CHILD") == "1" {
		for range 10_000 {
			Point("pep.after-claim")
			Point("not-armed")
		}
		os.Exit(0)
	}
	for _, arm := range []string{"pep.after-claim", "pep.after-claim@0.01", "*@0.01"} {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestPointKills$")
		cmd.Env = append(os.Environ(), "FAULT_CHILD=1", "ARAP_FAULT="+arm, "ARAP_FAULT_SEED=7")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		require.True(t, errors.As(err, &exit), "%s: the child must die, got %v", arm, err)
		ws := exit.Sys().(syscall.WaitStatus)
		require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "%s: %v", arm, ws)
		require.Equal(t, Prefix+"pep.after-claim\n", stderr.String(), arm)
	}
}

// TestMisspeltPointIsFatal: a point that does not exist, or a probability
// out of range, stops the process at start-up (exit 2) rather than arming
// nothing, which would let a crash test pass for the wrong reason.
func TestMisspeltPointIsFatal(t *testing.T) {
	if os.Getenv("FAULT_CHILD") == "2" {
		return // parse ran at package initialisation
	}
	for _, arm := range []string{"pep.after-clam", "pep.after-claim@1.5", "pep.after-claim@0"} {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestMisspeltPointIsFatal$")
		cmd.Env = append(os.Environ(), "FAULT_CHILD=2", "ARAP_FAULT="+arm)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		require.True(t, errors.As(err, &exit), "%s: %v %s", arm, err, out)
		require.Equal(t, 2, exit.ExitCode(), "%s: %s", arm, out)
		require.Contains(t, string(out), "ARAP_FAULT", arm)
	}
}

// TestUnarmedPointReturns: a point that is not armed returns, with nothing
// armed and with another point armed. The child reaches every point but
// the armed one, and must exit by itself, having said nothing.
func TestUnarmedPointReturns(t *testing.T) {
	if os.Getenv("FAULT_CHILD") == "3" {
		var arms []string // read here, not by parse, which is under test
		for _, a := range strings.Split(os.Getenv("ARAP_FAULT"), ",") {
			name, _, _ := strings.Cut(a, "@")
			arms = append(arms, name)
		}
		for _, name := range append(slices.Clone(Names), "not-a-point") {
			if !slices.Contains(arms, name) {
				Point(name)
			}
		}
		os.Exit(0)
	}
	for _, arm := range []string{"", "pep.after-claim", "pep.after-claim,notify.after-send@0.5"} {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestUnarmedPointReturns$")
		cmd.Env = append(os.Environ(), "FAULT_CHILD=3", "ARAP_FAULT="+arm, "ARAP_FAULT_SEED=7")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		require.NoError(t, cmd.Run(), "ARAP_FAULT=%q: %s", arm, stderr.String())
		require.Empty(t, stderr.String(), "ARAP_FAULT=%q", arm)
	}
}

// TestPointHolds: a held point says where and with which token, waits
// until the supervisor creates the release file, and then goes on: the
// child reaches the point and goes on only when it finds (and removes)
// the release file.
func TestPointHolds(t *testing.T) {
	if os.Getenv("FAULT_CHILD") == "4" {
		Point("pep.after-claim")
		_, _ = os.Stderr.WriteString("after\n")
		os.Exit(0)
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestPointHolds$")
	cmd.Env = append(os.Environ(), "FAULT_CHILD=4", "ARAP_FAULT_HOLD=pep.after-claim", "ARAP_FAULT_HOLD_DIR="+dir)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	r := bufio.NewReader(stderr)
	line, err := r.ReadString('\n')
	require.NoError(t, err)
	rest, ok := strings.CutPrefix(line, HoldPrefix+"pep.after-claim ")
	require.True(t, ok, "the hold line: %q", line)
	token := strings.TrimSpace(rest)
	require.NoError(t, os.WriteFile(filepath.Join(dir, token), nil, 0o600))
	after, err := r.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "after\n", after)
	require.NoError(t, cmd.Wait())
	_, err = os.Stat(filepath.Join(dir, token))
	// The held process consumed the release: it was waiting for it.
	require.ErrorIs(t, err, os.ErrNotExist, "the held process removes its release file")
}
