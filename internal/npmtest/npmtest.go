// Package npmtest installs third-party MCP servers published on npm for
// tests that run them as real processes: each package is installed once per
// cache directory and reused by every test binary after it.
//
// Without npm and node the tests that need them skip, unless
// ARAP_REQUIRE_NPM is set (CI), where they fail.
package npmtest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// FilesystemServer is the reference filesystem MCP server, pinned.
const FilesystemServer = "@modelcontextprotocol/server-filesystem@2026.8.31"

// EverythingServer is the reference server that exercises every MCP
// feature (content types, resources, prompts, progress), pinned.
const EverythingServer = "@modelcontextprotocol/server-everything@2026.8.31"

// The official TypeScript SDK's clients, pinned: v1 (@modelcontextprotocol/sdk)
// and v2 (@modelcontextprotocol/client), the newest of each served.
const (
	SDKv1 = "@modelcontextprotocol/sdk@1.32.2"
	SDKv2 = "@modelcontextprotocol/client@2.4.0"
)

var installed struct {
	sync.Mutex
	dirs map[string]string
}

// Package installs spec (name@version) once per cache and returns the
// directory holding its node_modules. The cache is ARAP_NPM_CACHE, else
// arap-test/npm under the user's cache directory.
func Package(t testing.TB, spec string) string {
	t.Helper()
	for _, tool := range []string{"npm", "node"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("ARAP_REQUIRE_NPM") != "" {
				t.Fatalf("%s is required (ARAP_REQUIRE_NPM is set) but not on PATH", tool)
			}
			t.Skipf("%s not on PATH: skipping the test against %s (set ARAP_REQUIRE_NPM=1 to fail instead)", tool, spec)
		}
	}
	installed.Lock()
	defer installed.Unlock()
	if d, ok := installed.dirs[spec]; ok {
		return d
	}
	cache := os.Getenv("ARAP_NPM_CACHE")
	if cache == "" {
		uc, err := os.UserCacheDir()
		require.NoError(t, err)
		cache = filepath.Join(uc, "arap-test", "npm")
	}
	safe := strings.NewReplacer("@", "", "/", "_").Replace(spec)
	dir := filepath.Join(cache, safe)
	if _, err := os.Stat(filepath.Join(dir, "installed")); err != nil {
		// Install beside, then rename: a half-finished install is never used.
		require.NoError(t, os.MkdirAll(cache, 0o755))
		tmp, err := os.MkdirTemp(cache, safe+".tmp")
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "npm", "install", "--prefix", tmp, "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error", spec)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "npm install %s: %s", spec, out)
		require.NoError(t, os.WriteFile(filepath.Join(tmp, "installed"), []byte(spec+"\n"), 0o644))
		_ = os.RemoveAll(dir)
		require.NoError(t, os.Rename(tmp, dir))
	}
	if installed.dirs == nil {
		installed.dirs = map[string]string{}
	}
	installed.dirs[spec] = dir
	return dir
}

// Filesystem installs FilesystemServer and returns the path of its
// executable (mcp-server-filesystem, run with the allowed directories as
// arguments).
func Filesystem(t testing.TB) string {
	t.Helper()
	return filepath.Join(Package(t, FilesystemServer), "node_modules", ".bin", "mcp-server-filesystem")
}

// Everything installs EverythingServer and returns the path of its
// executable (mcp-server-everything; its first argument picks the
// transport: stdio, sse or streamableHttp, the last listening on the port
// in PORT).
func Everything(t testing.TB) string {
	t.Helper()
	return filepath.Join(Package(t, EverythingServer), "node_modules", ".bin", "mcp-server-everything")
}
