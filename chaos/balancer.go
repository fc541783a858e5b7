package chaos

import (
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
		},
		Transport: &http.Transport{DialContext: (&net.Dialer{Timeout: 2 * time.Second}).DialContext, ResponseHeaderTimeout: 30 * time.Second,
			MaxIdleConnsPerHost: 64, IdleConnTimeout: 10 * time.Second},
	}
	b.srv = &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = b.srv.Serve(ln) }()
	return b, nil
}

func (b *balancer) add(target string) {
	u, _ := url.Parse(target)
	b.mu.Lock()
	b.targets = append(b.targets, u)
	b.mu.Unlock()
}

func (b *balancer) close() { _ = b.srv.Close() }
