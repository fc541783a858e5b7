package arapclient_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dbtest"
)

// The examples run against one real backend (HTTP on loopback, River, a
// fresh database), started on first use and stopped before the database.
func TestMain(m *testing.M) {
	code := m.Run()
	if shared.failed {
		code = 1
	}
	shared.stop()
	dbtest.Stop()
	os.Exit(code)
}

var (
	shared     mainTB
	sharedOnce sync.Once
	sharedEnv  *backendtest.Env
)

// exampleBackend is the backend the examples share: the dev seed policy,
// clients and people.
func exampleBackend() *backendtest.Env {
	sharedOnce.Do(func() { sharedEnv = backendtest.Start(&shared, backendtest.Options{}) })
	return sharedEnv
}

// mainTB is the testing.TB of what TestMain starts for the examples: the
// methods backendtest uses; any other panics through the nil embedded TB,
// which fails the example calling it.
type mainTB struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
	failed   bool
}

func (*mainTB) Helper()                  {}
func (*mainTB) Name() string             { return "arapclient-examples" }
func (*mainTB) Context() context.Context { return context.Background() }
func (*mainTB) Fatal(args ...any)        { panic(fmt.Sprint(args...)) }
func (*mainTB) Fatalf(f string, args ...any) {
	panic(fmt.Sprintf(f, args...))
}
func (s *mainTB) Errorf(f string, args ...any) {
	s.mu.Lock()
	s.failed = true
	s.mu.Unlock()
	fmt.Fprintf(os.Stderr, f+"\n", args...)
}
func (s *mainTB) Logf(f string, args ...any) { fmt.Fprintf(os.Stderr, f+"\n", args...) }
func (s *mainTB) Cleanup(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cleanups = append(s.cleanups, f)
}
func (s *mainTB) TempDir() string {
	d, err := os.MkdirTemp("", "arapclient-example-")
	if err != nil {
		panic(err)
	}
	s.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// stop runs the cleanups, last first.
func (s *mainTB) stop() {
	s.mu.Lock()
	fs := s.cleanups
	s.cleanups = nil
	s.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}
