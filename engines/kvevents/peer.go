package kvevents

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
	"go.uber.org/zap"
)

// A bound ZMQ socket does not say which connection a message came on, so
// bind mode accepts TCP itself: each accepted connection gets a SUB socket
// of its own, which "dials" that very connection through the peerTransport
// below, and every message it receives carries the connection's remote
// address. The publisher sees an ordinary ZMTP peer (the NULL mechanism
// is symmetric), so engines need no change (ingest.TestForgedPublisher).

// peerScheme is the zmq4 transport handing out accepted connections.
const peerScheme = "omnious-kv-peer"

var (
	registerPeer sync.Once
	peerConns    sync.Map // id -> net.Conn, taken once by Dial
	peerIDs      atomic.Uint64
)

type peerTransport struct{}

func (peerTransport) Dial(_ context.Context, _ transport.Dialer, addr string) (net.Conn, error) {
	c, ok := peerConns.LoadAndDelete(addr)
	if !ok {
		return nil, fmt.Errorf("no accepted connection %s", addr)
	}
	return c.(net.Conn), nil
}

func (peerTransport) Listen(context.Context, string) (net.Listener, error) {
	return nil, errors.New("the peer transport only dials accepted connections")
}

func (peerTransport) Addr(ep string) (string, error) { return ep, nil }

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

// closeWatch closes dead when the connection's reader sees an error, so
// the SUB socket on it can be closed (zmq4 would wait for a reconnect).
type closeWatch struct {
	net.Conn
	once sync.Once
	dead chan struct{}
}

func (c *closeWatch) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil {
		c.once.Do(func() { close(c.dead) })
	}
	return n, err
}

// acceptPeers accepts engines until ln is closed, refusing those
// PeerAllowed rejects, and sends every message of the others to msgs.
func (s *Subscriber) acceptPeers(ctx context.Context, ln net.Listener, msgs chan<- peerMsg) {
	registerPeer.Do(func() { _ = zmq4.RegisterTransport(peerScheme, peerTransport{}) })
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
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := &closeWatch{Conn: newBufConn(conn), dead: make(chan struct{})}
	id := strconv.FormatUint(peerIDs.Add(1), 10)
	peerConns.Store(id, net.Conn(w))
	sock := zmq4.NewSub(ctx)
	defer sock.Close()
	if err := sock.SetOption(zmq4.OptionSubscribe, s.cfg.Topic); err != nil {
		peerConns.Delete(id)
		_ = conn.Close()
		return
	}
	if err := sock.Dial(peerScheme + "://" + id); err != nil {
		peerConns.Delete(id)
		_ = conn.Close()
		s.log.Debug("kv event connection failed its handshake", zap.Stringer("peer", peer), zap.Error(err))
		return
	}
	go func() {
		select {
		case <-w.dead:
		case <-ctx.Done():
		}
		cancel()
		_ = conn.Close()
	}()
	for {
		msg, err := sock.Recv()
		if err != nil || ctx.Err() != nil {
			if ctx.Err() == nil {
				s.stats.Reconnects.Add(1)
			}
			return
		}
		select {
		case msgs <- peerMsg{frames: msg.Frames, peer: peer}:
		case <-ctx.Done():
			return
		}
	}
}
