package dbtest

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
)

// Switch is a TCP proxy on 127.0.0.1 whose target can change: what a DNS
// name or a connection pooler is to the processes. To sends new
// connections to another server and cuts those open, as a server that
// went away would; the processes reconnect through it.
type Switch struct {
	ln     net.Listener
	mu     sync.Mutex
	target string
	conns  map[net.Conn]struct{}
	closed bool
}

// NewSwitch listens on a free port of 127.0.0.1 and forwards to target
// ("127.0.0.1:5432"); it is closed when the test ends.
func NewSwitch(tb testing.TB, target string) *Switch {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("dbtest: switch: %v", err)
	}
	s := &Switch{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go s.accept()
	tb.Cleanup(s.close)
	return s
}

// Addr is the switch's address.
func (s *Switch) Addr() string { return s.ln.Addr().String() }

// URL is databaseURL with its host and port replaced by the switch's.
func (s *Switch) URL(databaseURL string) string {
	u, err := url.Parse(databaseURL)
	if err != nil {
		panic(err)
	}
	u.Host = s.Addr()
	return u.String()
}

// To sends new connections to target and cuts the open ones.
func (s *Switch) To(target string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.target = target
	for c := range s.conns {
		_ = c.Close()
		delete(s.conns, c)
	}
}

func (s *Switch) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		go s.serve(c)
	}
}

func (s *Switch) serve(c net.Conn) {
	s.mu.Lock()
	target := s.target
	s.mu.Unlock()
	up, err := net.Dial("tcp", target)
	if err != nil {
		_ = c.Close()
		return
	}
	s.mu.Lock()
	if s.closed || target != s.target {
		s.mu.Unlock()
		_ = c.Close()
		_ = up.Close()
		return
	}
	s.conns[c], s.conns[up] = struct{}{}, struct{}{}
	s.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	_ = c.Close()
	_ = up.Close()
	s.mu.Lock()
	delete(s.conns, c)
	delete(s.conns, up)
	s.mu.Unlock()
}

func (s *Switch) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	_ = s.ln.Close()
	s.To("")
}
