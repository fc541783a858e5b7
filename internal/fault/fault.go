// Package fault lets crash tests kill the process at a named point: when the
// ARAP_FAULT environment variable arms a point, reaching it sends SIGKILL to
// the process itself, as an operator's kill -9 or a power cut would. Without
// the variable, points cost one map lookup.
//
// ARAP_FAULT is a comma-separated list of NAME or NAME@P: NAME kills every
// time the point is reached, NAME@P with probability P (0 < P <= 1), so a
// chaos run can keep a narrow window under fire without stopping the process
// at its first call. "*@P" arms every point of Names. ARAP_FAULT_SEED makes
// the draws repeatable. Before it kills, a point writes
// "arap-fault: NAME" on stderr, so a supervisor can count which window each
// kill hit.
//
// ARAP_FAULT_HOLD (same syntax) holds the process at a point instead: it
// writes "arap-fault-hold: NAME TOKEN" on stderr and waits until the file
// TOKEN exists in ARAP_FAULT_HOLD_DIR, which the supervisor creates once it
// has done what the window is for (a failover run kills the database's
// primary while a replica holds just after its execution claim). A hold
// that nobody releases ends after HoldMax, so a lost supervisor cannot
// stall a process for ever.
package fault

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Names lists every point, one per window where a crash must not lose or
// repeat anything. A new point is added here as well as where it is reached.
var Names = []string{
	"pep.after-intent", // the submission intent is committed, nothing sent
	"pep.after-submit", // the backend has the request, the handle is not stored
	"pep.after-handle", // the handle is stored, the caller has no answer
	"pep.after-claim",  // the execution claim is committed, the tool not run
	"pep.after-invoke", // the tool ran, its outcome is not recorded
	"pep.after-ask",    // a task asks for in-task input: nothing waits for the answer but its look
	"requests.after-decision-commit",
	"requests.after-transition-commit",
	"requests.after-expire-commit", // a batch expired, its job not finished
	"callbacks.after-send",         // the receiver has the callback, the delivery is not marked
	"notify.after-send",
}

// Prefix starts the line a point writes on stderr before it kills.
const Prefix = "arap-fault: "

// HoldPrefix starts the line a held point writes: "arap-fault-hold: NAME
// TOKEN".
const HoldPrefix = "arap-fault-hold: "

// HoldMax bounds a hold nobody releases.
const HoldMax = time.Minute

var (
	armed   = parse(os.Getenv("ARAP_FAULT"))
	held    = parse(os.Getenv("ARAP_FAULT_HOLD"))
	holdDir = os.Getenv("ARAP_FAULT_HOLD_DIR")
	holds   int
	mu      sync.Mutex
	rng     = newRand(os.Getenv("ARAP_FAULT_SEED"))
)

// parse reads ARAP_FAULT into point -> probability. A malformed entry is
// fatal: a crash test that silently armed nothing would pass for the wrong
// reason.
func parse(v string) map[string]float64 {
	m := map[string]float64{}
	for _, p := range strings.Split(v, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		name, prob, hasProb := strings.Cut(p, "@")
		f := 1.0
		if hasProb {
			var err error
			if f, err = strconv.ParseFloat(prob, 64); err != nil || !(f > 0 && f <= 1) {
				fmt.Fprintf(os.Stderr, "ARAP_FAULT: %q: the probability must be a number in (0, 1]\n", p)
				os.Exit(2)
			}
		}
		if name == "*" {
			for _, n := range Names {
				m[n] = f
			}
			continue
		}
		if !slices.Contains(Names, name) {
			fmt.Fprintf(os.Stderr, "ARAP_FAULT: %q: no such fault point (fault.Names lists them)\n", name)
			os.Exit(2)
		}
		m[name] = f
	}
	return m
}

func newRand(seed string) *rand.Rand {
	s, err := strconv.ParseUint(seed, 10, 64)
	if err != nil {
		s = rand.Uint64()
	}
	return rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15))
}

// Point kills the process if name is armed (and its draw says so), or
// holds it there until released if name is held.
func Point(name string) {
	if draw(armed, name) {
		_, _ = os.Stderr.WriteString(Prefix + name + "\n")
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // never returns
	}
	if holdDir != "" && draw(held, name) {
		hold(name)
	}
}

func draw(points map[string]float64, name string) bool {
	p, ok := points[name]
	if !ok {
		return false
	}
	if p >= 1 {
		return true
	}
	mu.Lock()
	defer mu.Unlock()
	return rng.Float64() < p
}

// hold announces the point with a token unique in this process and waits
// for the release file.
func hold(name string) {
	mu.Lock()
	holds++
	token := fmt.Sprintf("%d-%d", os.Getpid(), holds)
	mu.Unlock()
	release := filepath.Join(holdDir, token)
	_, _ = os.Stderr.WriteString(HoldPrefix + name + " " + token + "\n")
	for end := time.Now().Add(HoldMax); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(release); err == nil {
			_ = os.Remove(release)
			return
		}
	}
}
