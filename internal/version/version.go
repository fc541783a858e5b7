// Package version says which build of arap is running: --version on arapd
// and arapctl, and the arap_build_info metric of both server processes.
//
// A release build sets the version and revision with the linker:
//
//	go build -ldflags "-X github.com/omcp/arap/internal/version.version=v1.2.3 \
//	  -X github.com/omcp/arap/internal/version.revision=$(git rev-parse HEAD)" ./cmd/...
//
// Without them it falls back to what the Go toolchain recorded in the binary
// (runtime/debug.ReadBuildInfo): the module version and the VCS revision,
// with "-dirty" when the working tree had changes.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// Set with -ldflags "-X github.com/omcp/arap/internal/version.version=..."
// (and .revision=...). Variables, not constants: the linker can only set
// those.
var (
	version  string
	revision string
)

// Info identifies a build.
type Info struct {
	Version   string // v1.2.3, or (devel) for a build outside a module version
	Revision  string // the VCS commit, "-dirty" appended for a modified tree; "unknown" when not recorded
	GoVersion string
}

// Get returns the running binary's build: the linker's values where set,
// else the build information the toolchain embedded.
func Get() Info {
	return get(version, revision, readBuildInfo)
}

var readBuildInfo = debug.ReadBuildInfo

func get(v, rev string, read func() (*debug.BuildInfo, bool)) Info {
	info := Info{Version: v, Revision: rev, GoVersion: runtime.Version()}
	if bi, ok := read(); ok {
		if info.Version == "" {
			info.Version = bi.Main.Version
		}
		if info.Revision == "" {
			var modified bool
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					info.Revision = s.Value
				case "vcs.modified":
					modified = s.Value == "true"
				}
			}
			if info.Revision != "" && modified {
				info.Revision += "-dirty"
			}
		}
		if bi.GoVersion != "" {
			info.GoVersion = bi.GoVersion
		}
	}
	if info.Version == "" {
		info.Version = "(devel)"
	}
	if info.Revision == "" {
		info.Revision = "unknown"
	}
	return info
}

// String is the line --version prints: "arapd v1.2.3 (revision abc123, go1.26.8)".
func (i Info) String(command string) string {
	return fmt.Sprintf("%s %s (revision %s, %s)", command, i.Version, i.Revision, i.GoVersion)
}

// Collector is the arap_build_info gauge: always 1, the build in its labels,
// so a dashboard can tell which replicas run which build.
func Collector() prometheus.Collector {
	i := Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "arap_build_info",
		Help:        "The running build of arap: version, VCS revision and Go version in the labels; the value is always 1.",
		ConstLabels: prometheus.Labels{"version": i.Version, "revision": i.Revision, "goversion": i.GoVersion},
	})
	g.Set(1)
	return g
}
