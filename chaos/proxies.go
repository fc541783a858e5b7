package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// proxies are the toxiproxy proxies (in process) between every pair of
// parts; a fault adds a toxic to one or disables it for a while.
type proxies struct {
	mu     sync.Mutex
	server *toxiproxy.ApiServer
	byName map[string]*toxiproxy.Proxy
	names  []string
}

func newProxies() *proxies {
	return &proxies{server: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop()),
		byName: map[string]*toxiproxy.Proxy{}}
}

// add starts a proxy on a free loopback port to upstream and returns its
// address.
func (p *proxies) add(name, upstream string) (string, error) {
	px := toxiproxy.NewProxy(p.server, name, "127.0.0.1:0", upstream)
	if err := px.Start(); err != nil {
		return "", fmt.Errorf("chaos: proxy %s: %w", name, err)
	}
	p.mu.Lock()
	p.byName[name] = px
	p.names = append(p.names, name)
	p.mu.Unlock()
	return px.Listen, nil
}

// toxic adds a toxic (toxiproxy JSON attributes) to both directions of the
// named proxy, or disables it (kind "cut": every connection closed, new
// ones refused).
func (p *proxies) toxic(name, kind, attrs string) error {
	p.mu.Lock()
	px := p.byName[name]
	p.mu.Unlock()
	if kind == "cut" {
		px.Stop()
		return nil
	}
	for _, stream := range []string{"downstream", "upstream"} {
		if kind == "reset_peer" && stream == "upstream" {
			continue // one reset is enough
		}
		body := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":%s}`, kind+"_"+stream, kind, stream, attrs)
		if _, err := px.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
			return fmt.Errorf("chaos: toxic %s on %s: %w", kind, name, err)
		}
	}
	return nil
}

// heal removes every toxic of the named proxy and re-enables it.
func (p *proxies) heal(name string) {
	p.mu.Lock()
	px := p.byName[name]
	p.mu.Unlock()
	px.Toxics.ResetToxics(context.Background())
	_ = px.Start() // ErrProxyAlreadyStarted when it was not cut
}

func (p *proxies) healAll() {
	for _, n := range p.list() {
		p.heal(n)
	}
}

func (p *proxies) list() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.names...)
}

func (p *proxies) stop() {
	for _, n := range p.list() {
		p.byName[n].Stop()
	}
}
