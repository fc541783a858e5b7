package pep

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTransitions: the phases and intent states are listed once (state.go),
// and nothing else moves them (no other statement in the state files). Every move is a listed transition, every
// listed transition has a move, a task that is done never moves again, and
// the lists agree with the schema's CHECK constraints. The only statements
// that set a phase or an intent's state are the two apply methods.
func TestTransitions(t *testing.T) {
	for _, m := range moves {
		for _, f := range m.from {
			require.True(t, canMove(f, m.to), "move %v -> %v is not a listed transition", f, m.to)
		}
	}
	for from, tos := range phaseTransitions {
		for _, to := range tos {
			require.True(t, slices.ContainsFunc(moves, func(m move) bool { return m.to == to && slices.Contains(m.from, from) }),
				"listed transition %v -> %v has no move", from, to)
		}
	}
	require.Empty(t, phaseTransitions[phaseDone], "done is terminal")

	for _, m := range intentMoves {
		for _, f := range m.from {
			require.True(t, canMoveIntent(f, m.to), "intent move %v -> %v is not a listed transition", f, m.to)
		}
	}
	for from, tos := range intentTransitions {
		for _, to := range tos {
			require.True(t, slices.ContainsFunc(intentMoves, func(m intentMove) bool { return m.to == to && slices.Contains(m.from, from) }),
				"listed intent transition %v -> %v has no move", from, to)
		}
	}
	for _, end := range []intentState{intentBound, intentFailed} {
		require.Empty(t, intentTransitions[end], "%v is settled", end)
	}

	schema, err := os.ReadFile("../migrations/pep/0001_init.sql")
	require.NoError(t, err)
	require.Contains(t, string(schema), "phase IN ("+quoted(phaseNames(allPhases))+")")
	states := make([]string, len(allIntentStates))
	for i, s := range allIntentStates {
		states[i] = string(s)
	}
	require.Contains(t, string(schema), "state IN ("+quoted(states)+")")

	var src []byte
	for _, f := range stateFiles {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		src = append(src, b...)
	}
	require.Len(t, regexp.MustCompile(`(?i)\bSET phase\b`).FindAll(src, -1), 1, "one statement sets a phase: move.apply")
	require.Len(t, regexp.MustCompile(`(?i)\bSET state\b`).FindAll(src, -1), 1, "one statement sets an intent's state: intentMove.apply")
}

func quoted(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = "'" + n + "'"
	}
	return strings.Join(q, ", ")
}

// TestOneOwnerPerTable: the front-end's tables have one owner each. No
// non-test Go file in the module names pep.approval_tasks or pep.intents
// but pep/state.go and its siblings (stateFiles), and none names pep.tasks outside mcp/tasks. The chaos
// checker's snapshot (chaos/snapshot.go) reads them as an outside auditor,
// so that the system is judged by its data rather than through its own code;
// it writes nothing.
func TestOneOwnerPerTable(t *testing.T) {
	auditor := func(p string) bool { return p == "chaos/snapshot.go" }
	owners := []struct {
		table *regexp.Regexp
		owner func(path string) bool
	}{
		{regexp.MustCompile(`\bpep\.(approval_tasks|intents)\b`), func(p string) bool {
			name, ok := strings.CutPrefix(p, "pep/")
			return ok && slices.Contains(stateFiles, name) || auditor(p)
		}},
		{regexp.MustCompile(`\bpep\.tasks\b`), func(p string) bool { return strings.HasPrefix(p, "mcp/tasks/") || auditor(p) }},
	}
	scanned := 0
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel("..", path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && rel != "." {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		scanned++
		for _, o := range owners {
			if !o.owner(rel) {
				require.Falsef(t, o.table.Match(src), "%s names %s, which only its owner may", rel, o.table.FindString(string(src)))
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, scanned, 50, "the scan saw the module")
}

// stateFiles are the files of pep that own pep.approval_tasks and
// pep.intents: state.go, and the statements it shares out by what they do.
var stateFiles = []string{"state.go", "stateopen.go", "statemove.go", "statesweep.go"}
