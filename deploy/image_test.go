package deploy

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"debug/elf"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/pgembed"
)

// TestImage builds the image with deploy/image.sh (podman), checks what is
// in it without running it (exactly two static binaries and the CA
// bundle, a numeric non-root user, no shell), then runs it as Kubernetes
// would (read-only root, no capabilities, no new privileges) against a
// PostgreSQL on the host: the migration, twice; arapd serve until /readyz
// answers 200; arapctl provisioning the front-end's API client; arapd mcp
// until its /readyz, which needs the backend, answers 200; both as uid
// 65532; and a SIGTERM ends each cleanly.
//
// It is slow (a static build of both binaries) and needs podman, so it runs
// only with ARAP_IMAGE_TEST=1, as .ci/run sets. Without podman it skips;
// when podman cannot run containers on the machine (cgroups, rlimits, user
// namespaces) it says exactly why and skips the running part; either skip
// is a failure with ARAP_REQUIRE_CONTAINERS=1.
func TestImage(t *testing.T) {
	if os.Getenv("ARAP_IMAGE_TEST") == "" {
		t.Skip("set ARAP_IMAGE_TEST=1 to build and run the image with podman (.ci/run does)")
	}
	podman, err := exec.LookPath("podman")
	if err != nil {
		if os.Getenv("ARAP_REQUIRE_CONTAINERS") != "" {
			require.NoError(t, err, "ARAP_IMAGE_TEST=1 needs podman (Debian: apt-get install podman)")
		}
		// Said as a skip, so that CI counts it (.ci/allowed-skips).
		t.Skip("podman is not installed (Debian: apt-get install podman): the image was neither built nor run")
	}
	ctx := t.Context()
	suffix := randomHex(4)
	tag := "localhost/arap:imagetest-" + suffix
	version := "v0.0.0-imagetest." + suffix

	began := time.Now()
	build := exec.CommandContext(ctx, "./image.sh", tag)
	build.Env = append(os.Environ(), "VERSION="+version, "CONTAINER_ENGINE="+podman)
	out, err := build.CombinedOutput()
	require.NoError(t, err, "deploy/image.sh: %s", out)
	t.Cleanup(func() { _ = exec.Command(podman, "rmi", "-f", tag).Run() })
	t.Logf("image %s built in %s", tag, time.Since(began).Round(time.Second))

	t.Run("contents", func(t *testing.T) { checkContents(t, podman, tag) })

	rt := containerRuntime(t, podman, tag)
	if rt == nil {
		return // skipped, with the reason logged
	}
	t.Run("version", func(t *testing.T) {
		out, err := rt.run(ctx, nil, "--version")
		require.NoError(t, err, "%s", out)
		require.Contains(t, out, version)
	})

	// PostgreSQL on the host, on a loopback port the containers reach
	// through the host's network.
	cluster, err := pgembed.Start(ctx, pgembed.Options{Port: -1, Ephemeral: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Stop(context.Background()) })
	conn, err := pgx.Connect(ctx, cluster.ConnString("postgres"))
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE DATABASE arap")
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
	dbURL := cluster.ConnString("arap")

	// The master keys as files, mounted where the manifests put them.
	dir := t.TempDir()
	keyFile := func(name string) string {
		p := filepath.Join(dir, name)
		key := make([]byte, 32)
		_, _ = rand.Read(key)
		require.NoError(t, os.WriteFile(p, []byte(base64.StdEncoding.EncodeToString(key)), 0o440))
		// As a Secret volume with fsGroup gives it: root's, group 65532,
		// mode 0440. Without root, readable by all instead.
		if err := os.Chown(p, 0, 65532); err != nil {
			t.Logf("key file not given to group 65532 (%v): mode 0444", err)
			require.NoError(t, os.Chmod(p, 0o444))
		}
		return p
	}
	serveKey, pepKey := keyFile("master-key"), keyFile("pep-master-key")
	policy, err := filepath.Abs("k8s/base/policy.yaml")
	require.NoError(t, err)

	// The migration Job, and its re-run (a Job retried, or the next
	// version's) finding nothing to do.
	for range 2 {
		out, err := rt.run(ctx, []string{"-e", "DATABASE_URL=" + dbURL}, "migrate")
		require.NoError(t, err, "arapd migrate: %s", out)
	}

	serveAddr, mcpAddr := freeAddr(t), freeAddr(t)
	serve := rt.start(t, "serve", []string{
		"-e", "DATABASE_URL=" + dbURL,
		"-e", "ARAP_ADDR=" + serveAddr,
		"-e", "ARAP_PUBLIC_URL=http://" + serveAddr,
		"-e", "ARAP_POLICY=/etc/arap/policy/policy.yaml",
		"-e", "ARAP_MASTER_KEY_FILE=/run/secrets/arap/master-key",
		"-v", policy + ":/etc/arap/policy/policy.yaml:ro",
		"-v", serveKey + ":/run/secrets/arap/master-key:ro",
	}, "serve")
	waitReady(t, rt, serve, "http://"+serveAddr)

	// Provisioning with arapctl from the image: the front-end's API client
	// and its webhook secret.
	ctl := []string{"--entrypoint", "/usr/local/bin/arapctl", "-e", "DATABASE_URL=" + dbURL,
		"-e", "ARAP_MASTER_KEY_FILE=/run/secrets/arap/master-key", "-v", serveKey + ":/run/secrets/arap/master-key:ro"}
	ctlOut, err := rt.run(ctx, ctl, "clients", "create", "--name", "pep", "--scope", "evaluate,request", "--actor", "agent:*",
		"--callback-prefix", "http://127.0.0.1:", "--callback-network", "loopback")
	require.NoError(t, err, "arapctl clients create: %s", ctlOut)
	token := regexp.MustCompile(`token: (\S+)`).FindStringSubmatch(ctlOut)
	require.NotNil(t, token, ctlOut)
	ctlOut, err = rt.run(ctx, ctl, "clients", "secret", "rotate", "pep")
	require.NoError(t, err, "arapctl clients secret rotate: %s", ctlOut)
	secret := regexp.MustCompile(`whsec_\S+`).FindString(ctlOut)
	require.NotEmpty(t, secret, ctlOut)

	mcp := rt.start(t, "mcp", []string{
		"-e", "DATABASE_URL=" + dbURL,
		"-e", "ARAP_MCP_ADDR=" + mcpAddr,
		"-e", "ARAP_MCP_PUBLIC_URL=http://" + mcpAddr,
		"-e", "ARAP_BACKEND_URL=http://" + serveAddr,
		"-e", "ARAP_BACKEND_TOKEN=" + token[1],
		"-e", "ARAP_WEBHOOK_SECRETS=" + secret,
		"-e", "ARAP_PEP_MASTER_KEY_FILE=/run/secrets/arap/pep-master-key",
		"-v", pepKey + ":/run/secrets/arap/pep-master-key:ro",
		// The starting upstreams file, as Compose and Kubernetes mount it:
		// without one (or --demo-tools) arapd mcp does not start.
		"-e", "ARAP_UPSTREAMS=/etc/arap/upstreams.yaml",
		"-v", upstreamsFile(t) + ":/etc/arap/upstreams.yaml:ro",
	}, "mcp")
	waitReady(t, rt, mcp, "http://"+mcpAddr)

	for _, c := range []string{serve, mcp} {
		// The process runs as 65532, inside the container and on the host.
		out, err := exec.Command(podman, append(rt.global, "top", c, "user", "huser")...).CombinedOutput()
		require.NoError(t, err, "podman top: %s", out)
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		require.Len(t, lines, 2, "one process, no shell or helper: %s", out)
		require.Equal(t, []string{"65532", "65532"}, strings.Fields(lines[1]), "%s", out)
	}
	for _, c := range []string{mcp, serve} {
		// SIGTERM (what the kubelet sends after preStop) ends it cleanly.
		out, err := exec.Command(podman, append(rt.global, "stop", "-t", "30", c)...).CombinedOutput()
		require.NoError(t, err, "podman stop: %s", out)
		out, err = exec.Command(podman, append(rt.global, "inspect", c, "--format", "{{.State.ExitCode}}")...).CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Equal(t, "0", strings.TrimSpace(string(out)), "exit status after SIGTERM; logs:\n%s", rt.logs(c))
	}
	t.Logf("image built and run in %s", time.Since(began).Round(time.Second))
}

// checkContents: exactly the two binaries and the CA bundle, both binaries
// static, a numeric non-root user, arapd serve by default.
func checkContents(t *testing.T, podman, tag string) {
	out, err := exec.Command(podman, "create", tag).Output()
	require.NoError(t, err)
	ctr := strings.TrimSpace(string(out))
	defer exec.Command(podman, "rm", "-f", ctr).Run() //nolint:errcheck
	export := exec.Command(podman, "export", ctr)
	pipe, err := export.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, export.Start())
	files := map[string][]byte{}
	tr := tar.NewReader(pipe)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		if h.Typeflag == tar.TypeDir {
			continue
		}
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		files[strings.TrimPrefix(h.Name, "./")] = b
	}
	require.NoError(t, export.Wait())
	var names []string
	for n := range files {
		names = append(names, n)
	}
	require.ElementsMatch(t, []string{"etc/ssl/certs/ca-certificates.crt", "usr/local/bin/arapd", "usr/local/bin/arapctl"}, names,
		"nothing but the binaries and the CA bundle: no shell, no passwd")
	require.Contains(t, string(files["etc/ssl/certs/ca-certificates.crt"]), "BEGIN CERTIFICATE")
	for _, bin := range []string{"usr/local/bin/arapd", "usr/local/bin/arapctl"} {
		f, err := elf.NewFile(bytes.NewReader(files[bin]))
		require.NoError(t, err, bin)
		for _, p := range f.Progs {
			require.NotEqual(t, elf.PT_INTERP, p.Type, "%s is dynamically linked (no loader in a FROM scratch image)", bin)
		}
		libs, err := f.ImportedLibraries()
		require.NoError(t, err)
		require.Empty(t, libs, "%s needs shared libraries", bin)
	}
	out, err = exec.Command(podman, "image", "inspect", tag, "--format", "{{json .Config}}").Output()
	require.NoError(t, err)
	var cfg struct {
		User       string
		Entrypoint []string
		Cmd        []string
	}
	require.NoError(t, json.Unmarshal(out, &cfg))
	require.Equal(t, "65532:65532", cfg.User)
	require.Equal(t, []string{"/usr/local/bin/arapd"}, cfg.Entrypoint)
	require.Equal(t, []string{"serve"}, cfg.Cmd)
}

// runtime is how podman runs containers on this machine: global flags
// (the OCI runtime) and run flags (limits), both found by containerRuntime.
type runtime struct {
	podman, image string
	global, flags []string
}

// The hardening of every run, as in the Kubernetes manifests.
var hardened = []string{"--network", "host", "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"}

func (r *runtime) args(extra []string, detach bool, name string, cmd ...string) []string {
	a := append(append([]string{}, r.global...), "run")
	if detach {
		a = append(a, "-d", "--name", name)
	} else {
		a = append(a, "--rm")
	}
	a = append(append(append(a, hardened...), r.flags...), extra...)
	return append(append(a, r.image), cmd...)
}

func (r *runtime) run(ctx context.Context, extra []string, cmd ...string) (string, error) {
	out, err := exec.CommandContext(ctx, r.podman, r.args(extra, false, "", cmd...)...).CombinedOutput()
	return string(out), err
}

// start runs a detached container, removed at the end of the test.
func (r *runtime) start(t *testing.T, what string, extra []string, cmd ...string) string {
	name := "arap-imagetest-" + what + "-" + randomHex(4)
	out, err := exec.Command(r.podman, r.args(extra, true, name, cmd...)...).CombinedOutput()
	require.NoError(t, err, "podman run %s: %s", what, out)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs of %s:\n%s", name, r.logs(name))
		}
		_ = exec.Command(r.podman, append(r.global, "rm", "-f", "-t", "0", name)...).Run()
	})
	return name
}

func (r *runtime) logs(name string) string {
	out, _ := exec.Command(r.podman, append(r.global, "logs", name)...).CombinedOutput()
	return string(out)
}

// containerRuntime finds a way to run containers here: podman's defaults
// first; then with limits below the machine's (crun and runc set every
// rlimit they are given, and raising one needs CAP_SYS_RESOURCE, which a
// container or VM may not grant); then runc (crun refuses a hybrid cgroup
// layout with controllers on the v2 hierarchy). It returns nil, having
// skipped the rest of the test with every error, when none works and
// every error is the machine's, not the image's.
func containerRuntime(t *testing.T, podman, image string) *runtime {
	limits := []string{"--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"}
	tries := []*runtime{
		{podman: podman, image: image},
		{podman: podman, image: image, flags: limits},
	}
	if _, err := exec.LookPath("runc"); err == nil {
		tries = append(tries, &runtime{podman: podman, image: image, global: []string{"--runtime", "runc"}, flags: limits})
	}
	var reasons []string
	for _, r := range tries {
		out, err := r.run(t.Context(), nil, "help")
		if err == nil && strings.Contains(out, "usage: arapd") {
			t.Logf("podman runs containers with %q %q", r.global, r.flags)
			return r
		}
		reasons = append(reasons, fmt.Sprintf("podman %s: %v: %s", strings.Join(r.args(nil, false, "", "help"), " "), err, strings.TrimSpace(out)))
	}
	// The machine's limits, named; anything else (a binary that cannot be
	// executed, a missing loader) is the image's fault.
	machine := regexp.MustCompile(`(?i)rlimit|cgroup|namespace|newuidmap|newgidmap|overlay|fuse|seccomp|apparmor|selinux`)
	for _, r := range reasons {
		if !machine.MatchString(r) {
			require.Failf(t, "the image does not run", "%s", strings.Join(reasons, "\n"))
		}
	}
	if os.Getenv("ARAP_REQUIRE_CONTAINERS") != "" {
		require.Failf(t, "podman cannot run containers here", "%s", strings.Join(reasons, "\n"))
	}
	t.Skipf("podman cannot run containers on this machine; the image was built and checked, not run:\n%s", strings.Join(reasons, "\n"))
	return nil
}

// waitReady waits until base/readyz answers 200 and /healthz too; a
// container that exits meanwhile fails at once, with its logs.
func waitReady(t *testing.T, r *runtime, name, base string) {
	deadline := time.Now().Add(90 * time.Second)
	client := &http.Client{Timeout: 2 * time.Second}
	last := ""
	for {
		resp, err := client.Get(base + "/readyz")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		} else {
			last = err.Error()
		}
		out, _ := exec.Command(r.podman, append(r.global, "inspect", name, "--format", "{{.State.Running}}")...).Output()
		if strings.TrimSpace(string(out)) == "false" {
			require.Failf(t, "container exited", "%s before /readyz answered 200 (last: %s); logs:\n%s", name, last, r.logs(name))
		}
		if time.Now().After(deadline) {
			require.Failf(t, "not ready", "%s/readyz did not answer 200 within 90 s (last: %s); logs:\n%s", base, last, r.logs(name))
		}
		time.Sleep(200 * time.Millisecond) // polling an external process: nothing to wait on
	}
	resp, err := client.Get(base + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s/healthz", base)
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return "127.0.0.1:" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// upstreamsFile is deploy/k8s/base/upstreams.yaml, by absolute path.
func upstreamsFile(t *testing.T) string {
	abs, err := filepath.Abs(filepath.Join("k8s", "base", "upstreams.yaml"))
	require.NoError(t, err)
	return abs
}
