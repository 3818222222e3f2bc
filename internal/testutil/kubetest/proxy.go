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
	addr   string
	target string

	mu    sync.Mutex
	ln    net.Listener // nil while cut
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
	p := &Proxy{addr: ln.Addr().String(), target: e.Host[len("https://"):], conns: map[net.Conn]struct{}{}}
	p.serve(ln)
	t.Cleanup(func() {
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// Config is a copy of rc that reaches the API server through the relay.
func (p *Proxy) Config(rc *rest.Config) *rest.Config {
	c := rest.CopyConfig(rc)
	c.Host = "https://" + p.addr
	return c
}

// Cut closes every relayed connection (a client's open watches end as if
// the server had closed them) and the listening socket, so new connections
// are refused, as by an API server that is down, until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
}

// Restore listens on the same address again.
func (p *Proxy) Restore() error {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return err
	}
	p.serve(ln)
	return nil
}

func (p *Proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			if p.ln != ln { // cut while this one was accepted
				p.mu.Unlock()
				_, _ = c.Close(), up.Close()
				continue
			}
			p.conns[c], p.conns[up] = struct{}{}, struct{}{}
			p.mu.Unlock()
			p.wg.Go(func() { p.pipe(c, up) })
			p.wg.Go(func() { p.pipe(up, c) })
		}
	})
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
