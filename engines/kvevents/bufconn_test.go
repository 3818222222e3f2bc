package kvevents

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
	"github.com/stretchr/testify/require"
)

// TestDialEndpoint: tcp:// and ipc:// endpoints dial; what the subscriber
// cannot dial is refused with the endpoint named, before any connection.
func TestDialEndpoint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	sock := filepath.Join(t.TempDir(), "kv.sock")
	uln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	defer uln.Close()
	for _, tc := range []struct {
		endpoint string
		ok       bool
	}{
		{"tcp://" + ln.Addr().String(), true},
		{"ipc://" + sock, true},
		{"inproc://kv", false},
		{"udp://127.0.0.1:5557", false},
		{"127.0.0.1:5557", false},
		{"tcp://", false},
	} {
		c, err := dialEndpoint(context.Background(), tc.endpoint, time.Second)
		if !tc.ok {
			require.ErrorContains(t, err, "bad endpoint", tc.endpoint)
			continue
		}
		require.NoError(t, err, tc.endpoint)
		require.IsType(t, &bufConn{}, c, tc.endpoint)
		require.NoError(t, c.Close())
	}
}

// acceptPub accepts one connection on ln and plays a PUB peer on it:
// zmq4's handshake, then the first message the subscriber sends (its
// subscription).
func acceptPub(t *testing.T, ln net.Listener) (*zmq4.Conn, zmq4.Msg) {
	t.Helper()
	c, err := ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	zc, err := zmq4.Open(c, null.Security(), zmq4.Pub, nil, true, nil)
	require.NoError(t, err)
	msg, err := zc.RecvMsg()
	require.NoError(t, err)
	return zc, msg
}

// TestSubscriberOnZMTPConn: on the wire, openSub is a zmq4 SUB socket (the
// same socket type in the handshake, the same subscription message); a
// PING from the publisher is answered and skipped, and the messages after
// it arrive whole.
func TestSubscriberOnZMTPConn(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	const topic = "kv@10.0.0.1:8000@m"

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sock := zmq4.NewSub(ctx)
	defer sock.Close()
	require.NoError(t, sock.SetOption(zmq4.OptionSubscribe, topic))
	go func() { _ = sock.Dial("tcp://" + ln.Addr().String()) }()
	fromSocket, wantMsg := acceptPub(t, ln)

	type opened struct {
		zc  *zmq4.Conn
		err error
	}
	done := make(chan opened, 1)
	go func() {
		c, err := dialEndpoint(ctx, "tcp://"+ln.Addr().String(), time.Second)
		if err != nil {
			done <- opened{err: err}
			return
		}
		t.Cleanup(func() { _ = c.Close() })
		zc, err := openSub(c, topic, time.Second)
		done <- opened{zc, err}
	}()
	fromOpenSub, gotMsg := acceptPub(t, ln)
	o := <-done
	require.NoError(t, o.err)

	require.Equal(t, fromSocket.Peer.Meta["Socket-Type"], fromOpenSub.Peer.Meta["Socket-Type"])
	require.Equal(t, string(zmq4.Sub), fromOpenSub.Peer.Meta["Socket-Type"])
	require.Equal(t, wantMsg.Type, gotMsg.Type)
	require.Equal(t, wantMsg.Frames, gotMsg.Frames)
	require.Equal(t, [][]byte{append([]byte{1}, topic...)}, gotMsg.Frames)

	require.NoError(t, fromOpenSub.SendCmd(zmq4.CmdPing, []byte{0, 0}))
	batch := [][]byte{[]byte(topic), {0, 0, 0, 0, 0, 0, 0, 7}, []byte("payload")}
	require.NoError(t, fromOpenSub.SendMsg(zmq4.NewMsgFrom(batch...)))
	frames, err := recvMsg(o.zc)
	require.NoError(t, err)
	require.Equal(t, batch, frames)
	pong, err := fromOpenSub.RecvCmd()
	require.NoError(t, err)
	require.Equal(t, zmq4.CmdPong, pong.Name)
}

// countConn counts reads on the connection.
type countConn struct {
	net.Conn
	reads atomic.Int64
}

func (c *countConn) Read(p []byte) (int, error) {
	c.reads.Add(1)
	return c.Conn.Read(p)
}

// TestBufConnReadsOnce: frames read piecewise (a header, then a body, as
// zmq4 does) take one read of the connection for all that has arrived.
func TestBufConnReadsOnce(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	cc := &countConn{Conn: a}
	c := newBufConn(cc)
	sent := make([]byte, 3000)
	for i := range sent {
		sent[i] = byte(i)
	}
	go func() { _, _ = b.Write(sent) }()
	got := make([]byte, 0, len(sent))
	for len(got) < len(sent) {
		var hdr [2]byte
		_, err := io.ReadFull(c, hdr[:])
		require.NoError(t, err)
		body := make([]byte, 98)
		_, err = io.ReadFull(c, body)
		require.NoError(t, err)
		got = append(append(got, hdr[:]...), body...)
	}
	require.Equal(t, sent, got)
	require.Equal(t, int64(1), cc.reads.Load())
}

// TestSilentPeerClosed: a connection that never completes the ZMTP
// handshake is closed after MaxBackoff, in bind mode as in dial mode,
// rather than held open for ever.
func TestSilentPeerClosed(t *testing.T) {
	for _, bind := range []bool{true, false} {
		t.Run(map[bool]string{true: "bind", false: "dial"}[bind], func(t *testing.T) {
			const timeout = 200 * time.Millisecond
			cfg := SubscriberConfig{Bind: bind, MinBackoff: timeout, MaxBackoff: timeout}
			var silent net.Conn
			if bind {
				cfg.Endpoint = "tcp://127.0.0.1:0"
				s := startSubscriber(t, cfg, &recorder{})
				c, err := net.Dial("tcp", strings.TrimPrefix(s.Endpoint(), "tcp://"))
				require.NoError(t, err)
				silent = c
			} else {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				require.NoError(t, err)
				defer ln.Close()
				cfg.Endpoint = "tcp://" + ln.Addr().String()
				startSubscriber(t, cfg, &recorder{})
				c, err := ln.Accept()
				require.NoError(t, err)
				silent = c
			}
			defer silent.Close()
			start := time.Now()
			require.NoError(t, silent.SetReadDeadline(start.Add(5*time.Second)))
			_, err := io.Copy(io.Discard, silent) // the greeting, then EOF
			require.NoError(t, err, "closed by the subscriber, not by the test's deadline")
			require.Less(t, time.Since(start), 5*timeout)
			require.GreaterOrEqual(t, time.Since(start), timeout/2)
		})
	}
}
