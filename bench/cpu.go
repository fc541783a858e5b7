package bench

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// The parts of the system whose CPU time a measurement reports, in
// report order. postgres is the server and every process it started
// (backends, autovacuum workers, the WAL writer), those gone included.
var cpuParts = []string{"arapd serve", "arapd mcp", "postgres", "upstream", "arapbench"}

// cpuSample is each part's CPU time (user and system) so far, and the
// machine's busy and total time.
type cpuSample struct {
	parts       map[string]time.Duration
	busy, total time.Duration
}

// userHZ is the unit of /proc's CPU times (USER_HZ, 100 on Linux).
const userHZ = 100

func ticks(n int64) time.Duration { return time.Duration(n) * time.Second / userHZ }

// procCPU reads /proc/<pid>/stat: the process's own CPU time, and that of
// its children it has waited for (cutime, cstime).
func procCPU(pid string) (own, reaped time.Duration, ppid string, err error) {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return 0, 0, "", err
	}
	// The fields after the command (which may hold spaces) in ")".
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, "", fmt.Errorf("bench: /proc/%s/stat: no command", pid)
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 15 {
		return 0, 0, "", fmt.Errorf("bench: /proc/%s/stat: %d fields", pid, len(f))
	}
	n := func(k int) int64 { v, _ := strconv.ParseInt(string(f[k]), 10, 64); return v }
	// state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime
	return ticks(n(11) + n(12)), ticks(n(13) + n(14)), string(f[1]), nil
}

// cpu samples the system's CPU times. A process it cannot read counts zero.
func (s *System) cpu() cpuSample {
	c := cpuSample{parts: map[string]time.Duration{}}
	for name, pid := range map[string]int{"arapd serve": s.Serve.cmd.Process.Pid, "arapd mcp": s.MCP.cmd.Process.Pid,
		"upstream": s.upstream.Process.Pid, "arapbench": os.Getpid()} {
		own, _, _, _ := procCPU(strconv.Itoa(pid))
		c.parts[name] = own
	}
	server := strconv.Itoa(s.cluster.Pid())
	own, reaped, _, _ := procCPU(server)
	c.parts["postgres"] = own + reaped
	if dirs, err := os.ReadDir("/proc"); err == nil {
		for _, d := range dirs {
			if _, err := strconv.Atoi(d.Name()); err != nil {
				continue
			}
			if own, _, ppid, err := procCPU(d.Name()); err == nil && ppid == server {
				c.parts["postgres"] += own
			}
		}
	}
	if f, err := os.Open("/proc/stat"); err == nil {
		var name string
		var v [8]int64
		_, _ = fmt.Fscan(f, &name, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7])
		f.Close()
		for i, x := range v {
			c.total += ticks(x)
			if i != 3 && i != 4 { // idle, iowait
				c.busy += ticks(x)
			}
		}
	}
	return c
}

// CPU is where a measurement's CPU time went: each part's time per
// successful call, and the share of the machine's time that was busy.
type CPU struct {
	PerCall map[string]time.Duration `json:"per_call_ns"`
	Busy    float64                  `json:"machine_busy"`
}

func (c cpuSample) since(start cpuSample, calls int) *CPU {
	if calls == 0 || c.total <= start.total {
		return nil
	}
	out := &CPU{PerCall: map[string]time.Duration{}, Busy: float64(c.busy-start.busy) / float64(c.total-start.total)}
	for _, p := range cpuParts {
		out.PerCall[p] = (c.parts[p] - start.parts[p]) / time.Duration(calls)
	}
	return out
}

func (c *CPU) print(w io.Writer, name string) {
	var total time.Duration
	fmt.Fprintf(w, "  %-36s", name)
	for _, p := range cpuParts {
		fmt.Fprintf(w, " %8.3f", c.PerCall[p].Seconds()*1000)
		total += c.PerCall[p]
	}
	fmt.Fprintf(w, " %8.3f %5.0f%%\n", total.Seconds()*1000, c.Busy*100)
}
