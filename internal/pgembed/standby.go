package pgembed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Streaming standbys, for tests of failover: a cluster's copy that follows
// its WAL (pg_basebackup -R), optionally as a synchronous standby, that can
// be promoted (pg_ctl promote); and Kill, a crash of the postmaster.
//
// A cluster made by initdb is ready to be the primary of one: wal_level is
// replica, max_wal_senders is 10, and pg_hba.conf (initdb --auth=trust)
// lets local and loopback connections replicate.

// StandbyOptions configure a standby (Cluster.StartStandby).
type StandbyOptions struct {
	// Name is the standby's application_name on the primary
	// (pg_stat_replication, synchronous_standby_names). Defaults to
	// "standby".
	Name string
	// Synchronous adds Name to the primary's synchronous_standby_names
	// (ALTER SYSTEM and a reload): once StartStandby returns, a commit on
	// the primary waits for this standby (with the primary's
	// synchronous_commit on, remote_write or remote_apply; Options.Ephemeral
	// sets it off, so an ephemeral primary does not wait). With several
	// synchronous standbys the first connected in the list is the
	// synchronous one and the others are potential ones.
	Synchronous bool
	// DataDir, Port, Ephemeral, RunAs, Log and Settings are as in Options
	// (an empty DataDir is a temporary directory that Stop removes). The
	// standby is never initdb'd: its data is the primary's base backup.
	DataDir   string
	Port      int
	Ephemeral bool
	RunAs     string
	Log       io.Writer
	Settings  []string
}

// StartStandby makes a streaming standby of c: a base backup of c (pg_basebackup
// -R, so that it follows c's WAL as a hot standby: read-only, writes refused
// with SQLSTATE 25006), started on its own socket and port. It returns once
// the standby accepts connections and c reports it streaming (and, with
// Synchronous, as its synchronous standby). Stop it as any cluster; Promote
// makes it a primary.
//
// The base backup carries c's postgresql.auto.conf; its
// synchronous_standby_names is dropped from the standby's copy, so that a
// promoted standby does not wait for standbys it does not have.
func (c *Cluster) StartStandby(ctx context.Context, opts StandbyOptions) (*Cluster, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	if opts.Name == "" {
		opts.Name = "standby"
	}
	cred, err := credential(opts.RunAs)
	if err != nil {
		return nil, err
	}
	temp := ""
	dir := opts.DataDir
	if dir == "" {
		if temp, err = os.MkdirTemp("", "arap-pg-standby-"); err != nil {
			return nil, fmt.Errorf("pgembed: temp dir: %w", err)
		}
		dir = filepath.Join(temp, "data")
		if cred != nil {
			// Start hands the data directory to the server account; its
			// parent must let that account in.
			if err := chownTree(temp, cred); err != nil {
				_ = os.RemoveAll(temp)
				return nil, err
			}
		}
	}
	fail := func(err error) (*Cluster, error) {
		if temp != "" {
			_ = os.RemoveAll(temp)
		}
		return nil, err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return fail(fmt.Errorf("pgembed: standby data dir: %w", err))
	}
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); err == nil {
		return fail(fmt.Errorf("pgembed: standby data dir %s already holds a cluster", dir))
	}

	// The backup's connection names the standby, and -R writes it as the
	// standby's primary_conninfo; it is written again below with the
	// application_name, which not every pg_basebackup carries over. The
	// backup runs as this process (root too): Start then hands the files to
	// the server account.
	conninfo := c.conninfo() + " application_name=" + opts.Name
	args := []string{"-D", dir, "-d", conninfo, "-R", "-X", "stream", "-c", "fast"}
	if opts.Ephemeral {
		args = append(args, "--no-sync")
	}
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "pg_basebackup"), args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("pgembed: pg_basebackup of %s: %w\n%s", c.dataDir, err, out))
	}
	if err := rewriteAutoConf(filepath.Join(dir, "postgresql.auto.conf"), "primary_conninfo = '"+strings.ReplaceAll(conninfo, "'", "''")+"'"); err != nil {
		return fail(err)
	}
	s, err := Start(ctx, Options{DataDir: dir, Port: opts.Port, Ephemeral: opts.Ephemeral, RunAs: opts.RunAs, Log: opts.Log, Settings: opts.Settings})
	if err != nil {
		return fail(err)
	}
	s.temp = temp

	if opts.Synchronous {
		if err := c.addSynchronous(ctx, opts.Name); err != nil {
			_ = s.Stop(context.Background())
			return nil, err
		}
	}
	if err := c.waitStandby(ctx, opts.Name, opts.Synchronous); err != nil {
		_ = s.Stop(context.Background())
		return nil, err
	}
	return s, nil
}

// conninfo is the keyword/value connection string of c as the superuser,
// for the replication connection.
func (c *Cluster) conninfo() string {
	if c.tcp {
		return fmt.Sprintf("host=127.0.0.1 port=%d user=postgres sslmode=disable", c.port)
	}
	return fmt.Sprintf("host=%s port=%d user=postgres sslmode=disable", c.socketDir, c.port)
}

// rewriteAutoConf drops synchronous_standby_names and primary_conninfo from
// a standby's postgresql.auto.conf and appends line.
func rewriteAutoConf(path, line string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("pgembed: standby: %w", err)
	}
	var kept []string
	for _, l := range strings.Split(strings.TrimRight(string(raw), "\n"), "\n") {
		name := strings.TrimSpace(l)
		if strings.HasPrefix(name, "synchronous_standby_names") || strings.HasPrefix(name, "primary_conninfo") {
			continue
		}
		kept = append(kept, l)
	}
	kept = append(kept, line)
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("pgembed: standby: %w", err)
	}
	if err := os.WriteFile(path, []byte(strings.Join(kept, "\n")+"\n"), st.Mode().Perm()); err != nil {
		return fmt.Errorf("pgembed: standby: %w", err)
	}
	return nil
}

// addSynchronous adds name to c's synchronous_standby_names and reloads.
func (c *Cluster) addSynchronous(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, c.ConnString("postgres"))
	if err != nil {
		return fmt.Errorf("pgembed: synchronous standby: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var cur string
	if err := conn.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&cur); err != nil {
		return fmt.Errorf("pgembed: synchronous standby: %w", err)
	}
	quoted := pgx.Identifier{name}.Sanitize()
	next := quoted
	switch cur = strings.TrimSpace(cur); {
	case cur == "":
	case strings.HasSuffix(cur, ")"):
		// FIRST n (a, b) or ANY n (a, b).
		next = strings.TrimSuffix(cur, ")") + ", " + quoted + ")"
	default:
		next = cur + ", " + quoted
	}
	if _, err := conn.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = "+quoteLiteral(next)); err != nil {
		return fmt.Errorf("pgembed: synchronous standby: %w", err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("pgembed: synchronous standby: %w", err)
	}
	return nil
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// waitStandby waits until c streams to the standby called name (as its
// synchronous standby or a potential one, if sync).
func (c *Cluster) waitStandby(ctx context.Context, name string, sync bool) error {
	conn, err := pgx.Connect(ctx, c.ConnString("postgres"))
	if err != nil {
		return fmt.Errorf("pgembed: standby: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	deadline := time.Now().Add(60 * time.Second)
	state, syncState := "", ""
	for time.Now().Before(deadline) {
		err := conn.QueryRow(ctx, `SELECT coalesce(state, ''), coalesce(sync_state, '') FROM pg_stat_replication
			WHERE application_name = $1 ORDER BY backend_start DESC LIMIT 1`, name).Scan(&state, &syncState)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("pgembed: standby: %w", err)
		}
		// A synchronous standby listed after a connected one is a
		// potential one: it waits its turn.
		if state == "streaming" && (!sync || syncState != "async") {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("pgembed: standby %s not streaming after 60s (state %q, sync_state %q)", name, state, syncState)
}

// Promote makes a standby a primary (pg_ctl promote) and returns once it
// accepts writes (pg_is_in_recovery() is false).
func (c *Cluster) Promote(ctx context.Context) error {
	bin, err := BinDir()
	if err != nil {
		return err
	}
	cred, err := c.serverCredential()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "pg_ctl"), "promote", "-D", c.dataDir, "-w", "-t", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	cmd.Dir = c.dataDir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgembed: pg_ctl promote %s: %w\n%s", c.dataDir, err, out)
	}
	conn, err := pgx.Connect(ctx, c.ConnString("postgres"))
	if err != nil {
		return fmt.Errorf("pgembed: promote: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		var recovering bool
		if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&recovering); err != nil {
			return fmt.Errorf("pgembed: promote: %w", err)
		}
		if !recovering {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("pgembed: %s still in recovery 60s after pg_ctl promote", c.dataDir)
}

// serverCredential is the account the server runs as, for pg_ctl (which
// refuses to run as root): the data directory's owner when root.
func (c *Cluster) serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	st, err := os.Stat(c.dataDir)
	if err != nil {
		return nil, fmt.Errorf("pgembed: %w", err)
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok || sys.Uid == 0 {
		return nil, fmt.Errorf("pgembed: cannot tell the server account of %s", c.dataDir)
	}
	return &syscall.Credential{Uid: sys.Uid, Gid: sys.Gid}, nil
}

// Kill crashes the server: SIGKILL to the postmaster alone, as kill -9
// would. Its backends notice and exit on their own (sessions in flight end
// without an answer); Kill returns once the postmaster and all of them are
// gone, so that nothing answers at its address any more and Start on the
// same DataDir and Port recovers the cluster from its WAL. Temporary
// directories are removed, as by Stop; a later Stop does nothing.
func (c *Cluster) Kill() error {
	var err error
	c.stopOnce.Do(func() {
		if c.cmd == nil || c.cmd.Process == nil {
			return
		}
		// The backends are the postmaster's children, each in a process
		// group of its own (they call setsid): found by their parent.
		children := childrenOf(c.cmd.Process.Pid)
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
		<-c.exited
		deadline := time.Now().Add(30 * time.Second)
		for _, pid := range children {
			for syscall.Kill(pid, 0) == nil {
				if time.Now().After(deadline) {
					_ = syscall.Kill(pid, syscall.SIGKILL)
					err = errors.New("pgembed: a killed postmaster's backend did not exit within 30s; sent it SIGKILL")
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		c.cleanup()
		c.stopErr = err
	})
	return err
}

// childrenOf lists the processes whose parent is pid (from /proc; none
// where there is no /proc).
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(stat[i+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out
}

// SocketDir is the directory of the server's Unix socket (a pooler in
// front of it may connect there, so that its connections are told apart
// from TCP ones: client_addr is null in pg_stat_activity).
func (c *Cluster) SocketDir() string { return c.socketDir }
