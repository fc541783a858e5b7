package sep2848

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

type traceability struct {
	SEP          int    `yaml:"sep"`
	SpecURL      string `yaml:"spec_url"`
	Requirements []struct {
		Check    string `yaml:"check"`
		Text     string `yaml:"text"`
		Excluded string `yaml:"excluded"`
	} `yaml:"requirements"`
}

// TestTraceability keeps conformance/sep-2848.yaml, the SEP and the check
// registry in step: every MUST and SHOULD of the SEP lies inside a row's
// quoted text, every row quotes the SEP verbatim and has a registered check
// or a reason, every registered check is traced, no MUST check rests on
// SHOULD sentences alone, and every test an exclusion points at exists
// (with the subtest it quotes).
func TestTraceability(t *testing.T) {
	raw, err := os.ReadFile("../sep-2848.yaml")
	require.NoError(t, err)
	var doc traceability
	dec := yaml.NewDecoder(strings.NewReader(string(raw)))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(&doc))
	require.Equal(t, 2848, doc.SEP)
	require.NotEmpty(t, doc.SpecURL)

	seedRaw, err := os.ReadFile("testdata/sep-2848-tool-approval.txt")
	require.NoError(t, err)
	seed := strings.Join(strings.Fields(string(seedRaw)), " ")

	covered := make([]bool, len(seed))
	// A check is binding if some row it is traced to is not only a SHOULD
	// (a MUST, or a declarative statement of behaviour).
	traced, binding := map[string]bool{}, map[string]bool{}
	should, must := regexp.MustCompile(`\bSHOULD\b`), regexp.MustCompile(`\bMUST\b`)
	for i, r := range doc.Requirements {
		require.NotEmpty(t, r.Text, "row %d has no text", i)
		require.True(t, (r.Check == "") != (r.Excluded == ""), "row %d needs exactly one of check and excluded", i)
		if r.Check != "" {
			_, ok := checkByID[r.Check]
			require.True(t, ok, "row %d names unregistered check %s", i, r.Check)
			traced[r.Check] = true
			binding[r.Check] = binding[r.Check] || must.MatchString(r.Text) || !should.MatchString(r.Text)
		}
		text := strings.Join(strings.Fields(r.Text), " ")
		at := strings.Index(seed, text)
		require.GreaterOrEqual(t, at, 0, "row %d does not quote the SEP: %q", i, text)
		for ; at >= 0; at = indexFrom(seed, text, at+1) {
			for j := at; j < at+len(text); j++ {
				covered[j] = true
			}
		}
	}
	for _, loc := range regexp.MustCompile(`\b(MUST|SHOULD)\b`).FindAllStringIndex(seed, -1) {
		if !covered[loc[0]] {
			from := max(loc[0]-120, 0)
			t.Errorf("untraced %s: ...%s...", seed[loc[0]:loc[1]], seed[from:min(loc[1]+80, len(seed))])
		}
	}
	for i, r := range doc.Requirements {
		for _, ref := range testRef.FindAllStringSubmatch(r.Excluded, -1) {
			if msg := testExists(ref[1], ref[2], ref[3]); msg != "" {
				t.Errorf("row %d: %s", i, msg)
			}
		}
	}
	for _, c := range Checks {
		if !traced[c.ID] {
			t.Errorf("check %s is in no row of sep-2848.yaml", c.ID)
		}
		if c.Level == "MUST" && !binding[c.ID] {
			t.Errorf("check %s is a MUST but traced only to SHOULD sentences", c.ID)
		}
	}
}

// testRef finds pkg.TestName in an exclusion (pkg a directory of the
// repository, mcp/tasks.TestX included), with the subtest it may quote
// right after it: e2e.TestApprovalFlows ("grant pending...").
var testRef = regexp.MustCompile(`\b([a-z][a-z0-9]*(?:/[a-z][a-z0-9]*)*)\.(Test[A-Za-z0-9_]+)(?:,? \(?"([^"]+)")?`)

// testExists reports what is missing of test name in package directory pkg
// (relative to the repository root), and of its subtest, or "".
func testExists(pkg, name, subtest string) string {
	files, _ := filepath.Glob(filepath.Join("..", "..", pkg, "*_test.go"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil || !strings.Contains(string(b), "func "+name+"(") {
			continue
		}
		if subtest != "" && !strings.Contains(string(b), `"`+subtest) {
			return fmt.Sprintf("%s.%s has no subtest %q", pkg, name, subtest)
		}
		return ""
	}
	return fmt.Sprintf("no test %s.%s", pkg, name)
}

func indexFrom(s, sub string, from int) int {
	if from >= len(s) {
		return -1
	}
	i := strings.Index(s[from:], sub)
	if i < 0 {
		return -1
	}
	return from + i
}
