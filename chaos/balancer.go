package chaos

import (
	"bytes"
	"errors"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"
)

// balancer is the load balancer of the two backends (net/http/httputil):
// each request goes to a random one, as behind a real balancer; a backend
// that is down answers 502, which clients retry.
type balancer struct {
	mu      sync.Mutex
	targets []*url.URL
	srv     *http.Server
	addr    string
}

func startBalancer() (*balancer, error) {
	b := &balancer{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	b.addr = ln.Addr().String()
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			b.mu.Lock()
			t := b.targets[rand.IntN(len(b.targets))]
			b.mu.Unlock()
			r.SetURL(t)
			r.Out.Host = r.In.Host // the backends see the public host
			if r.Out.Body != nil && r.Out.Body != http.NoBody {
				// Kept (bounded) so a refused connection can go elsewhere.
				body, err := io.ReadAll(io.LimitReader(r.Out.Body, 4<<20))
				if err == nil {
					r.Out.Body = io.NopCloser(bytes.NewReader(body))
					r.Out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
				}
			}
		},
		Transport: &failover{b: b, next: &http.Transport{DialContext: (&net.Dialer{Timeout: 2 * time.Second}).DialContext, ResponseHeaderTimeout: 30 * time.Second,
			MaxIdleConnsPerHost: 64, IdleConnTimeout: 10 * time.Second}},
		ErrorLog: log.New(io.Discard, "", 0),
	}
	b.srv = &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = b.srv.Serve(ln) }()
	return b, nil
}

// failover sends a request whose connection was refused (its backend is
// down, restarting) to another backend, as a balancer's health check would;
// nothing of the request has been sent then.
type failover struct {
	b    *balancer
	next http.RoundTripper
}

func (f *failover) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := f.next.RoundTrip(r)
	var op *net.OpError
	if err == nil || !errors.As(err, &op) || op.Op != "dial" || (r.Body != nil && r.GetBody == nil) {
		return resp, err
	}
	f.b.mu.Lock()
	targets := append([]*url.URL(nil), f.b.targets...)
	f.b.mu.Unlock()
	for _, t := range targets {
		if t.Host == r.URL.Host {
			continue
		}
		r2 := r.Clone(r.Context())
		r2.URL.Scheme, r2.URL.Host = t.Scheme, t.Host
		if r.GetBody != nil {
			if r2.Body, err = r.GetBody(); err != nil {
				return nil, err
			}
		}
		return f.next.RoundTrip(r2)
	}
	return resp, err
}

func (b *balancer) add(target string) {
	u, _ := url.Parse(target)
	b.mu.Lock()
	b.targets = append(b.targets, u)
	b.mu.Unlock()
}

func (b *balancer) close() { _ = b.srv.Close() }
