package kubetest

import (
	"io"
	"net"
	"sync"
	"testing"

	"k8s.io/client-go/rest"
)

// Proxy is a TCP relay on 127.0.0.1 in front of the API server, so a test
// can take the network away from one client (Cut) while the control plane
// keeps running, then give it back (Restore). TLS passes through: the
// serving certificate names 127.0.0.1.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// Proxy starts a relay to the API server, closed when the test ends.
func (e *Env) Proxy(t testing.TB) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("kubetest: proxy: %v", err)
	}
	p := &Proxy{ln: ln, target: e.Host[len("https://"):], conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// Config is a copy of rc that reaches the API server through the relay.
func (p *Proxy) Config(rc *rest.Config) *rest.Config {
	c := rest.CopyConfig(rc)
	c.Host = "https://" + p.ln.Addr().String()
	return c
}

// Cut closes every relayed connection (a client's open watches end with a
// connection error) and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// Restore relays new connections again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.down {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(c, up) })
		p.wg.Go(func() { p.pipe(up, c) })
	}
}

// pipe copies one direction; when it ends, both sides close.
func (p *Proxy) pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

func (p *Proxy) close() {
	_ = p.ln.Close()
	p.Cut()
	p.wg.Wait()
}
