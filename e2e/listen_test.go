package e2e

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// listeningPort waits until process pid listens on a TCP port and returns
// it. It is for third-party servers that take a port to bind but do not
// say which one they got: started on port 0, the kernel picks a free port
// as it binds, so no other process can take it between a test's choice and
// the server's bind (a port picked by the test and closed again could be).
// The port is found the way ss -ltnp finds it: the inodes of the process's
// sockets (/proc/PID/fd), matched against the listening sockets of
// /proc/net/tcp and tcp6. exited is closed when the process ends.
func listeningPort(t *testing.T, pid int, exited <-chan struct{}, timeout time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		port, err := listenPortOf(pid)
		require.NoError(t, err)
		if port != 0 {
			return port
		}
		select {
		case <-exited:
			t.Fatalf("process %d exited before it listened", pid)
		case <-time.After(20 * time.Millisecond): // polling /proc
		}
		require.False(t, time.Now().After(deadline), "process %d did not listen within %s", pid, timeout)
	}
}

// listenPortOf is the port of a listening TCP socket of pid, or 0.
func listenPortOf(pid int) (int, error) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0, nil // exited or not started yet: the caller waits
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		if ino, ok := strings.CutPrefix(target, "socket:["); ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			continue // no IPv6
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // the header
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[3] != "0A" || !inodes[fields[9]] { // 0A: LISTEN
				continue
			}
			_, hexPort, _ := strings.Cut(fields[1], ":")
			port, err := strconv.ParseUint(hexPort, 16, 16)
			if err != nil {
				f.Close()
				return 0, fmt.Errorf("%s: local address %q: %w", table, fields[1], err)
			}
			f.Close()
			return int(port), nil
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return 0, err
		}
	}
	return 0, nil
}
