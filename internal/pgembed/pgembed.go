// Package pgembed runs a private PostgreSQL cluster from the binaries already
// installed on the machine. Dev mode and the test suites use it so that nothing
// has to be set up by hand: a cluster is created (initdb) on first use, started
// as a child process, and stopped cleanly.
//
// PostgreSQL refuses to run as root. When the calling process is root, the
// cluster's files are handed to an unprivileged account (the "postgres" user by
// default) and the server runs under that account.
package pgembed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Options configure a cluster. The zero value starts a throwaway cluster in a
// fresh temporary directory, listening only on a Unix socket.
type Options struct {
	// DataDir holds the cluster. Empty means a temporary directory that Stop
	// removes. An existing cluster in DataDir is reused.
	DataDir string
	// Port, when non-zero, also listens on 127.0.0.1:Port. -1 picks a free
	// port. Zero listens on the Unix socket only.
	Port int
	// Ephemeral trades durability for speed (fsync off): for tests only.
	Ephemeral bool
	// RunAs names the account to run as when the process is root. Defaults to
	// $ARAP_PG_USER or "postgres".
	RunAs string
	// Log receives the server's output. Defaults to a file postgres.log next to
	// the data directory.
	Log io.Writer
	// Settings are more server settings, as "name=value".
	Settings []string
}

// Cluster is a running PostgreSQL server.
type Cluster struct {
	dataDir   string
	socketDir string
	port      int
	tcp       bool
	temp      string // removed on Stop when non-empty
	cmd       *exec.Cmd
	logFile   *os.File
	exited    chan struct{}
	stopOnce  sync.Once
	stopErr   error
}

// ErrNotInstalled is returned when no PostgreSQL server binaries can be found.
var ErrNotInstalled = errors.New("pgembed: no PostgreSQL server binaries found (looked on PATH, in `pg_config --bindir` and under /usr/lib/postgresql/*/bin); install the server package, e.g. `apt-get install postgresql` on Debian or `brew install postgresql` on macOS")

// searchGlob is where Debian-style installs keep versioned binaries.
var searchGlob = "/usr/lib/postgresql/*/bin"

// BinDir locates the directory holding initdb and postgres.
func BinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		dir := filepath.Dir(p)
		if real, err := filepath.EvalSymlinks(p); err == nil {
			dir = filepath.Dir(real)
		}
		if hasServer(dir) {
			return dir, nil
		}
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if hasServer(dir) {
			return dir, nil
		}
	}
	matches, _ := filepath.Glob(searchGlob)
	sort.Slice(matches, func(i, j int) bool { return pgMajor(matches[i]) > pgMajor(matches[j]) })
	for _, dir := range matches {
		if hasServer(dir) {
			return dir, nil
		}
	}
	return "", ErrNotInstalled
}

func hasServer(dir string) bool {
	for _, name := range []string{"initdb", "postgres"} {
		if st, err := os.Stat(filepath.Join(dir, name)); err != nil || st.IsDir() {
			return false
		}
	}
	return true
}

func pgMajor(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// Start creates the cluster if needed and starts the server. It returns once
// the server accepts connections.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	cred, err := credential(opts.RunAs)
	if err != nil {
		return nil, err
	}

	c := &Cluster{exited: make(chan struct{})}
	base := opts.DataDir
	if base == "" {
		if c.temp, err = os.MkdirTemp("", "arap-pg-"); err != nil {
			return nil, fmt.Errorf("pgembed: temp dir: %w", err)
		}
		base = filepath.Join(c.temp, "data")
	}
	if base, err = filepath.Abs(base); err != nil {
		return nil, fmt.Errorf("pgembed: data dir: %w", err)
	}
	c.dataDir = base
	// The socket lives in a short directory of its own: Unix socket paths are
	// limited to about 100 bytes.
	if c.socketDir, err = os.MkdirTemp("", "arap-pgs-"); err != nil {
		c.cleanup()
		return nil, fmt.Errorf("pgembed: socket dir: %w", err)
	}
	if err := os.MkdirAll(c.dataDir, 0o700); err != nil {
		c.cleanup()
		return nil, fmt.Errorf("pgembed: create %s: %w", c.dataDir, err)
	}
	if cred != nil {
		for _, d := range []string{c.temp, c.dataDir, c.socketDir} {
			if d != "" {
				if err := chownTree(d, cred); err != nil {
					c.cleanup()
					return nil, err
				}
			}
		}
		if err := checkTraversable(c.dataDir, cred); err != nil {
			c.cleanup()
			return nil, err
		}
	}

	logw := opts.Log
	if logw == nil {
		logPath := c.dataDir + ".log"
		if c.logFile, err = os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err != nil {
			c.cleanup()
			return nil, fmt.Errorf("pgembed: open log: %w", err)
		}
		logw = c.logFile
	}

	if _, err := os.Stat(filepath.Join(c.dataDir, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		args := []string{"-D", c.dataDir, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C"}
		if opts.Ephemeral {
			args = append(args, "--no-sync")
		}
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		cmd.Dir = c.dataDir
		if out, err := cmd.CombinedOutput(); err != nil {
			c.cleanup()
			return nil, fmt.Errorf("pgembed: initdb %s: %w\n%s", c.dataDir, err, out)
		}
	}

	c.port = 5432
	if opts.Port != 0 {
		c.tcp = true
		c.port = opts.Port
		if c.port < 0 {
			if c.port, err = freePort(); err != nil {
				c.cleanup()
				return nil, err
			}
		}
	}
	listen := ""
	if c.tcp {
		listen = "127.0.0.1"
	}
	args := []string{
		"-D", c.dataDir,
		"-k", c.socketDir,
		"-p", strconv.Itoa(c.port),
		"-c", "listen_addresses=" + listen,
		"-c", "max_connections=200",
		"-c", "shared_buffers=64MB",
	}
	if opts.Ephemeral {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	for _, kv := range opts.Settings {
		args = append(args, "-c", kv)
	}
	cmd := exec.Command(filepath.Join(bin, "postgres"), args...)
	// Pdeathsig stops the server if this process dies without calling Stop,
	// so a killed test binary or dev server leaves no postgres behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	cmd.Stdout, cmd.Stderr = logw, logw
	cmd.Dir = c.dataDir
	if err := cmd.Start(); err != nil {
		c.cleanup()
		return nil, fmt.Errorf("pgembed: start postgres: %w", err)
	}
	c.cmd = cmd
	go func() { _ = cmd.Wait(); close(c.exited) }()

	if err := c.waitReady(ctx); err != nil {
		_ = c.Stop(context.Background())
		return nil, err
	}
	return c, nil
}

func (c *Cluster) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(60 * time.Second)
	var lastErr error
	for time.Now().Before(deadline) {
		select {
		case <-c.exited:
			return c.exitedErr()
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, c.ConnString("postgres"))
		if err == nil {
			err = conn.Ping(cctx)
			_ = conn.Close(cctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		lastErr = err
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("pgembed: postgres not ready after 60s: %w", lastErr)
}

// ConnString returns a connection URL for database db as the superuser.
func (c *Cluster) ConnString(db string) string {
	if c.tcp {
		return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
	}
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&port=%d&sslmode=disable", db, c.socketDir, c.port)
}

// Pid is the server's (the postmaster's) process id; its backends are its
// children.
func (c *Cluster) Pid() int { return c.cmd.Process.Pid }

// DataDir is the cluster's data directory.
func (c *Cluster) DataDir() string { return c.dataDir }

// Port is the port the server listens on (on 127.0.0.1 when Options.Port
// was set): after a stop, Start with the same DataDir and this Port brings
// the same cluster back at the same address.
func (c *Cluster) Port() int { return c.port }

// Stop shuts the server down ("fast" mode: sessions are disconnected, the
// cluster is left consistent) and removes temporary directories.
func (c *Cluster) Stop(ctx context.Context) error { return c.stop(ctx, syscall.SIGINT) }

// StopImmediate stops the server as a crash would ("immediate" mode,
// SIGQUIT: no checkpoint, sessions cut; the next start recovers from the
// WAL). For fault tests.
func (c *Cluster) StopImmediate(ctx context.Context) error { return c.stop(ctx, syscall.SIGQUIT) }

func (c *Cluster) stop(ctx context.Context, sig syscall.Signal) error {
	c.stopOnce.Do(func() {
		if c.cmd != nil && c.cmd.Process != nil {
			_ = c.cmd.Process.Signal(sig)
			timeout := time.NewTimer(30 * time.Second)
			defer timeout.Stop()
			select {
			case <-c.exited:
			case <-ctx.Done():
				_ = c.cmd.Process.Signal(syscall.SIGQUIT)
				<-c.exited
				c.stopErr = ctx.Err()
			case <-timeout.C:
				_ = c.cmd.Process.Signal(syscall.SIGQUIT)
				<-c.exited
				c.stopErr = errors.New("pgembed: postgres did not stop within 30s; sent SIGQUIT")
			}
		}
		c.cleanup()
	})
	return c.stopErr
}

func (c *Cluster) cleanup() {
	if c.logFile != nil {
		_ = c.logFile.Close()
	}
	if c.socketDir != "" {
		_ = os.RemoveAll(c.socketDir)
	}
	if c.temp != "" {
		_ = os.RemoveAll(c.temp)
	}
}

// credential returns the identity to run PostgreSQL under, or nil when the
// process is not root and can run it itself.
func credential(runAs string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	if runAs == "" {
		runAs = os.Getenv("ARAP_PG_USER")
	}
	if runAs == "" {
		runAs = "postgres"
	}
	u, err := user.Lookup(runAs)
	if err != nil {
		return nil, fmt.Errorf("pgembed: running as root, and PostgreSQL refuses to run as root; unprivileged account %q not found (create it or set ARAP_PG_USER): %w", runAs, err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	if uid == 0 {
		return nil, fmt.Errorf("pgembed: account %q is root; PostgreSQL needs an unprivileged account", runAs)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func chownTree(dir string, cred *syscall.Credential) error {
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if err := os.Lchown(p, int(cred.Uid), int(cred.Gid)); err != nil {
			return fmt.Errorf("pgembed: chown %s: %w", p, err)
		}
		return nil
	})
}

// checkTraversable reports a clear error when the unprivileged account cannot
// reach dir because an ancestor directory is closed to others (e.g. /root).
func checkTraversable(dir string, cred *syscall.Credential) error {
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("pgembed: stat %s: %w", d, err)
		}
		sys, _ := st.Sys().(*syscall.Stat_t)
		mode := st.Mode().Perm()
		ok := mode&0o001 != 0 ||
			(sys != nil && sys.Uid == cred.Uid && mode&0o100 != 0) ||
			(sys != nil && sys.Gid == cred.Gid && mode&0o010 != 0)
		if !ok {
			return &NotTraversableError{Dir: d}
		}
		if d == "/" || d == "." {
			return nil
		}
	}
}

// NotTraversableError says the server account cannot reach the data directory.
type NotTraversableError struct{ Dir string }

func (e *NotTraversableError) Error() string {
	return fmt.Sprintf("pgembed: the PostgreSQL account cannot enter %s (no search permission for others); choose a data directory outside it", e.Dir)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgembed: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// exitedErr says why postgres exited during start-up, from its log: its
// FATAL line, and what to do about the usual one, a data directory that
// another server (another arapd dev) already runs on.
func (c *Cluster) exitedErr() error {
	log := c.dataDir + ".log"
	raw, _ := os.ReadFile(log)
	fatal := ""
	for _, line := range strings.Split(string(raw), "\n") {
		if _, after, ok := strings.Cut(line, "FATAL:"); ok {
			fatal = strings.TrimSpace(after)
		}
	}
	switch {
	case strings.Contains(fatal, "postmaster.pid") && strings.Contains(fatal, "already exists"):
		return fmt.Errorf("pgembed: another PostgreSQL already runs on %s (another arapd dev in this directory?): stop it, or give this one another data directory (--data-dir)", c.dataDir)
	case fatal != "":
		return fmt.Errorf("pgembed: postgres exited during start-up: %s (see %s)", fatal, log)
	}
	return fmt.Errorf("pgembed: postgres exited during start-up; see %s", log)
}
