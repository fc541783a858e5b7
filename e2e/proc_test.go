package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
)

var (
	binDir   string
	buildErr error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "arap-e2e-bin-")
	if err != nil {
		panic(err)
	}
	binDir = dir
	for _, cmd := range []string{"arapd", "arapctl"} {
		out, err := osexec.Command("go", "build", "-o", filepath.Join(dir, cmd), "../cmd/"+cmd).CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("build %s: %v\n%s", cmd, err, out)
		}
	}
	defer os.RemoveAll(dir)
	dbtest.Main(m)
}

// masterKey is a fixed test master key (base64).
var masterKey = base64.StdEncoding.EncodeToString([]byte("e2e-master-key-0123456789abcdef!"))

// proc is a running arapd process whose JSON log lines are collected.
type proc struct {
	t     *testing.T
	cmd   *osexec.Cmd
	mu    sync.Mutex
	lines []map[string]any
	raw   []string
	addr  string
	ready chan struct{}
	// done is closed when the process has exited and all it wrote to
	// stderr has been collected (Wait waits for the copy to end).
	done chan struct{}
	// started is the msg of the line that says the process is ready.
	started string
	partial []byte // an unfinished last line
}

// startArapd runs `arapd <args>` and waits until it logs that it started.
func startArapd(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	require.NoError(t, buildErr)
	return startBinary(t, filepath.Join(binDir, "arapd"), env, args...)
}

// startArapdIn is startArapd in working directory dir.
func startArapdIn(t *testing.T, dir string, env []string, args ...string) *proc {
	t.Helper()
	require.NoError(t, buildErr)
	return startBinaryIn(t, dir, filepath.Join(binDir, "arapd"), env, args...)
}

// startBinary is startArapd for another build of arapd.
func startBinary(t *testing.T, bin string, env []string, args ...string) *proc {
	t.Helper()
	return startBinaryIn(t, "", bin, env, args...)
}

// startBinaryIn is startBinary in working directory dir ("": the test's).
func startBinaryIn(t *testing.T, dir, bin string, env []string, args ...string) *proc {
	t.Helper()
	cmd := osexec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	p := &proc{t: t, cmd: cmd, ready: make(chan struct{}), done: make(chan struct{})}
	// The address is the backend's, or the front-end's for `arapd mcp`
	// (dev runs both; its front-end may start first).
	p.started = "backend started"
	if len(args) > 0 && args[0] == "mcp" {
		p.started = "mcp front-end started"
	}
	// Not StderrPipe: Wait closes that pipe as soon as the process exits,
	// dropping whatever the reader had not read yet (the last lines). With
	// a writer, Wait returns only once everything written was collected;
	// WaitDelay bounds that if a child ever held the pipe open.
	cmd.Stderr = p
	cmd.Stdout = io.Discard
	cmd.WaitDelay = 10 * time.Second
	require.NoError(t, cmd.Start())
	go func() { _ = cmd.Wait(); p.flush(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("arapd %v log:\n%s", args, strings.Join(p.logLines(), "\n"))
		}
	})
	select {
	case <-p.ready:
	case <-p.done:
		t.Fatalf("arapd exited before starting:\n%s", strings.Join(p.logLines(), "\n"))
	case <-time.After(60 * time.Second):
		t.Fatalf("arapd did not start within 60s:\n%s", strings.Join(p.logLines(), "\n"))
	}
	return p
}

// Write collects the process's stderr, one log line at a time (called by
// exec's copying goroutine only).
func (p *proc) Write(b []byte) (int, error) {
	p.partial = append(p.partial, b...)
	for {
		i := bytes.IndexByte(p.partial, '\n')
		if i < 0 {
			return len(b), nil
		}
		p.add(string(p.partial[:i]))
		p.partial = p.partial[i+1:]
	}
}

func (p *proc) flush() {
	if len(p.partial) > 0 {
		p.add(string(p.partial))
		p.partial = nil
	}
}

func (p *proc) add(line string) {
	var m map[string]any
	_ = json.Unmarshal([]byte(line), &m)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.raw = append(p.raw, line)
	if m == nil {
		return
	}
	p.lines = append(p.lines, m)
	if m["msg"] == p.started && p.addr == "" {
		p.addr, _ = m["addr"].(string)
		close(p.ready)
	}
}

// logLines is every line collected so far. The process writes its log
// through a pipe that this test reads on its own goroutine, so a line the
// process has written may not be here yet: wait for a line that must come
// (waitLog) before asserting on what the log does or does not hold.
func (p *proc) logLines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.raw...)
}

// mark is the number of JSON log lines collected so far, for waitLogAfter.
func (p *proc) mark() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.lines)
}

// waitLog waits for a log line with msg.
func (p *proc) waitLog(msg string, timeout time.Duration) map[string]any {
	p.t.Helper()
	return p.waitLogAfter(0, msg, timeout)
}

// waitLogAfter waits for a log line with msg among those collected after
// mark (see mark), so that an earlier line with the same msg does not count.
func (p *proc) waitLogAfter(mark int, msg string, timeout time.Duration) map[string]any {
	p.t.Helper()
	return p.waitLogWhere(mark, msg, nil, timeout)
}

// waitLogWhere is waitLogAfter for a line whose members also include each
// of want's: another request's line, written later than its response was
// read, does not count.
func (p *proc) waitLogWhere(mark int, msg string, want map[string]any, timeout time.Duration) map[string]any {
	p.t.Helper()
	deadline, exited := time.Now().Add(timeout), false
	for {
		p.mu.Lock()
	lines:
		for _, l := range p.lines[min(mark, len(p.lines)):] {
			if l["msg"] == msg {
				for k, v := range want {
					if l[k] != v {
						continue lines
					}
				}
				p.mu.Unlock()
				return l
			}
		}
		p.mu.Unlock()
		if exited {
			p.t.Fatalf("no log line %q %v: the process exited without writing it", msg, want)
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("no log line %q %v within %s", msg, want, timeout)
		}
		select {
		case <-p.done: // everything it wrote is collected: one last look
			exited = true
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (p *proc) url() string { return "http://" + p.addr }

// alive is nil while the process runs.
func (p *proc) alive() error {
	select {
	case <-p.done:
		return fmt.Errorf("exited: %v", p.cmd.ProcessState)
	default:
		return nil
	}
}

func (p *proc) signal(sig syscall.Signal) { require.NoError(p.t, p.cmd.Process.Signal(sig)) }

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		p.t.Fatalf("process did not exit within %s", timeout)
		return -1
	}
}

func arapctl(t *testing.T, env []string, args ...string) string {
	t.Helper()
	cmd := osexec.CommandContext(context.Background(), filepath.Join(binDir, "arapctl"), args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "arapctl %v: %s", args, out)
	return string(out)
}

// exec runs one of the built binaries to completion.
func exec(t *testing.T, env []string, name string, args ...string) error {
	t.Helper()
	cmd := osexec.Command(filepath.Join(binDir, name), args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %v: %w\n%s", name, args, err, out)
	}
	return nil
}

func stringsReader(s string) io.Reader { return strings.NewReader(s) }
