package version

import (
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

func buildInfo(version string, settings ...string) func() (*debug.BuildInfo, bool) {
	return func() (*debug.BuildInfo, bool) {
		bi := &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Path: "github.com/omcp/arap", Version: version}}
		for i := 0; i+1 < len(settings); i += 2 {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
		}
		return bi, true
	}
}

// TestLinkerValuesWin: values set with -X are reported as they are, over
// what the toolchain recorded.
func TestLinkerValuesWin(t *testing.T) {
	i := get("v1.2.3", "abc123", buildInfo("v0.0.1", "vcs.revision", "fff", "vcs.modified", "true"))
	require.Equal(t, Info{Version: "v1.2.3", Revision: "abc123", GoVersion: "go1.99.1"}, i)
	require.Equal(t, "arapd v1.2.3 (revision abc123, go1.99.1)", i.String("arapd"))
}

// TestBuildInfoFallback: without -X, the module version and VCS revision,
// marked dirty for a modified tree.
func TestBuildInfoFallback(t *testing.T) {
	require.Equal(t, Info{Version: "v0.4.0", Revision: "deadbeef-dirty", GoVersion: "go1.99.1"},
		get("", "", buildInfo("v0.4.0", "vcs.revision", "deadbeef", "vcs.modified", "true")))
	require.Equal(t, Info{Version: "(devel)", Revision: "deadbeef", GoVersion: "go1.99.1"},
		get("", "", buildInfo("(devel)", "vcs.revision", "deadbeef", "vcs.modified", "false")))
	require.Equal(t, Info{Version: "(devel)", Revision: "unknown", GoVersion: "go1.99.1"}, get("", "", buildInfo("")))
}

// TestCollector: arap_build_info is 1 with the build in its labels.
func TestCollector(t *testing.T) {
	version, revision = "v9.9.9", "cafe"
	t.Cleanup(func() { version, revision = "", "" })
	reg := prometheus.NewRegistry()
	reg.MustRegister(Collector())
	i := Get()
	want := `# HELP arap_build_info The running build of arap: version, VCS revision and Go version in the labels; the value is always 1.
# TYPE arap_build_info gauge
arap_build_info{goversion="` + i.GoVersion + `",revision="cafe",version="v9.9.9"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want), "arap_build_info"))
}

// TestLinkerFlags builds arapctl with the -X flags a release build passes
// (the Dockerfile's) and checks that --version reports them: the variable
// paths in the package comment are the ones that work.
func TestLinkerFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	bin := filepath.Join(t.TempDir(), "arapctl")
	build := exec.Command("go", "build", "-o", bin, "-ldflags",
		"-X github.com/omcp/arap/internal/version.version=v9.8.7 -X github.com/omcp/arap/internal/version.revision=0123abc",
		"github.com/omcp/arap/cmd/arapctl")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	out, err = exec.Command(bin, "--version").Output()
	require.NoError(t, err)
	require.Regexp(t, `^arapctl v9\.8\.7 \(revision 0123abc, go[0-9.]+\S*\)\n$`, string(out))
}
