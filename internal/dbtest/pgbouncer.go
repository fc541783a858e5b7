package dbtest

import (
	"context"
	"fmt"
	"net"
	"os"
	osexec "os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PgBouncer is a PgBouncer in transaction pooling mode in front of one
// database of a test's own cluster, as arapd meets it in production.
type PgBouncer struct {
	// URL connects to the database through it (TCP on 127.0.0.1).
	URL string
}

// PgBouncerOptions configure NewPgBouncer.
type PgBouncerOptions struct {
	// Host and Port are where PgBouncer reaches PostgreSQL: a Unix socket
	// directory (pgembed Cluster.SocketDir) or an address.
	Host     string
	Port     int
	Database string
	// PoolSize is the server connections per database and user (default
	// 5: fewer than the clients, so that they share them).
	PoolSize int
}

// NewPgBouncer starts pgbouncer (transaction mode, trust authentication
// as postgres), stopped when the test ends; the test skips where the
// binary is not installed (CI installs it: .ci/run).
func NewPgBouncer(tb testing.TB, o PgBouncerOptions) *PgBouncer {
	tb.Helper()
	bin, err := osexec.LookPath("pgbouncer")
	if err != nil {
		if bin, err = osexec.LookPath("/usr/sbin/pgbouncer"); err != nil {
			tb.Skip("pgbouncer is not installed (apt-get install pgbouncer)")
		}
	}
	if o.PoolSize == 0 {
		o.PoolSize = 5
	}
	dir, err := os.MkdirTemp("", "arap-pgbouncer-")
	if err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	ini := fmt.Sprintf(`[databases]
%s = host=%s port=%d dbname=%s user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 500
ignore_startup_parameters = extra_float_digits
logfile =
pidfile =
`, o.Database, o.Host, o.Port, o.Database, port, filepath.Join(dir, "users.txt"), o.PoolSize)
	for name, body := range map[string]string{"pgbouncer.ini": ini, "users.txt": `"postgres" ""` + "\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			tb.Fatalf("dbtest: %v", err)
		}
	}
	cmd := osexec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	// PgBouncer refuses to run as root: as the server's account then.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if os.Geteuid() == 0 {
		name := os.Getenv("ARAP_PG_USER")
		if name == "" {
			name = "postgres"
		}
		u, err := user.Lookup(name)
		if err != nil {
			tb.Fatalf("dbtest: pgbouncer as %s: %v", name, err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	logFile, err := os.Create(filepath.Join(dir, "pgbouncer.log"))
	if err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		tb.Fatalf("dbtest: start pgbouncer: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = logFile.Close()
	})
	b := &PgBouncer{URL: fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", port, o.Database)}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, b.URL+"&default_query_exec_mode=exec")
		if err == nil {
			_, err = conn.Exec(ctx, "SELECT 1")
			_ = conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return b
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			tb.Fatalf("dbtest: pgbouncer exited: %s", log)
		default:
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			tb.Fatalf("dbtest: pgbouncer not ready after 30s: %v\n%s", err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
