package kvevents

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// A bound ZMQ socket does not say which connection a message came on, so
// bind mode accepts TCP itself and runs each accepted connection as a
// dialed one's (openSub: zmq4's handshake, the subscription, RecvMsg on
// the connection's goroutine); every message it receives carries the
// connection's remote address. The publisher sees an ordinary ZMTP peer
// (the NULL mechanism is symmetric), so engines need no change
// (ingest.TestForgedPublisher).

// peerMsg is one message with the address of the connection it came on.
type peerMsg struct {
	frames [][]byte
	peer   netip.Addr
}

// listenTCP binds a tcp://host:port endpoint ("*" is every interface).
func listenTCP(endpoint string) (net.Listener, error) {
	addr, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return nil, fmt.Errorf("bind mode needs a tcp:// endpoint, not %q", endpoint)
	}
	if h, p, err := net.SplitHostPort(addr); err == nil && h == "*" {
		addr = net.JoinHostPort("", p)
	}
	return net.Listen("tcp", addr)
}

// acceptPeers accepts engines until ln is closed, refusing those
// PeerAllowed rejects, and sends every message of the others to msgs.
func (s *Subscriber) acceptPeers(ctx context.Context, ln net.Listener, msgs chan<- peerMsg) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors, say: wait and go on, as net/http does.
			s.log.Warn("kv event listener cannot accept; retrying", zap.Error(err))
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		ap, err := netip.ParseAddrPort(conn.RemoteAddr().String())
		if err != nil {
			_ = conn.Close()
			continue
		}
		peer := ap.Addr().Unmap()
		if s.cfg.PeerAllowed != nil && !s.cfg.PeerAllowed(peer) {
			s.stats.RefusedPeers.Add(1)
			s.log.Debug("kv event connection from an address no connecting engine has; closed", zap.Stringer("peer", peer))
			_ = conn.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.servePeer(ctx, conn, peer, msgs)
		}()
	}
}

// servePeer receives one engine's messages until its connection or ctx ends.
func (s *Subscriber) servePeer(ctx context.Context, conn net.Conn, peer netip.Addr, msgs chan<- peerMsg) {
	c := newBufConn(conn)
	defer c.Close()
	defer context.AfterFunc(ctx, func() { _ = c.Close() })()
	zc, err := openSub(c, s.cfg.Topic, s.cfg.MaxBackoff)
	if err != nil {
		s.log.Debug("kv event connection failed its handshake", zap.Stringer("peer", peer), zap.Error(err))
		return
	}
	for {
		frames, err := recvMsg(zc)
		if err != nil || ctx.Err() != nil {
			if ctx.Err() == nil {
				s.stats.Reconnects.Add(1)
			}
			return
		}
		select {
		case msgs <- peerMsg{frames: frames, peer: peer}:
		case <-ctx.Done():
			return
		}
	}
}
