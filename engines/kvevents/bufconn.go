package kvevents

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
)

// A subscriber receives on zmq4's ZMTP connection (zmq4.Conn) rather than
// through a zmq4 SUB socket: it dials (or, in bind mode, accepts) the
// connection itself, has zmq4 run the handshake (zmq4.Open) and send the
// subscription, and calls RecvMsg on its own goroutine. A socket would add,
// per message, a reading goroutine handing each message to the caller
// through a channel, and a context made and cancelled by every Recv. A
// subscriber needs none of what the socket adds: it has one peer,
// reconnects itself, and resubscribes on each connection.

// readBuffer is each connection's read buffer: several batches of 16
// blocks (about 1.5 KB each); a larger frame is read straight into its
// body. 1,024 engines hold 8 MiB of buffers.
const readBuffer = 8 << 10

// dialEndpoint dials a tcp:// or ipc:// endpoint, within timeout; its reads
// go through a buffer (bufConn).
func dialEndpoint(ctx context.Context, endpoint string, timeout time.Duration) (net.Conn, error) {
	network, addr, ok := strings.Cut(endpoint, "://")
	switch {
	case !ok || addr == "":
		return nil, fmt.Errorf("bad endpoint %q: want tcp://host:port or ipc://path", endpoint)
	case network == "tcp":
	case network == "ipc":
		network = "unix"
	default:
		return nil, fmt.Errorf("bad endpoint %q: the %s transport is not supported (tcp, ipc)", endpoint, network)
	}
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return newBufConn(c), nil
}

// openSub runs the ZMTP handshake on c as a SUB peer with the NULL
// mechanism and subscribes to topic, within timeout. The caller closes c
// (when its context ends, to end a RecvMsg waiting on it).
// TestSubscriberOnZMTPConn keeps what a publisher sees equal to what a
// zmq4 SUB socket sends.
func openSub(c net.Conn, topic string, timeout time.Duration) (*zmq4.Conn, error) {
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, fmt.Errorf("cannot set the handshake's deadline: %w", err)
	}
	zc, err := zmq4.Open(c, null.Security(), zmq4.Sub, nil, false, nil)
	if err != nil {
		return nil, fmt.Errorf("handshake: %w", err)
	}
	if err := zc.SendMsg(zmq4.NewMsg(append([]byte{1}, topic...))); err != nil {
		return nil, fmt.Errorf("subscribe: %w", err)
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return nil, fmt.Errorf("cannot clear the handshake's deadline: %w", err)
	}
	return zc, nil
}

// recvMsg returns the next message's frames, skipping ZMTP commands (a
// PING, which RecvMsg answers).
func recvMsg(zc *zmq4.Conn) ([][]byte, error) {
	for {
		msg, err := zc.RecvMsg()
		if err != nil {
			return nil, err
		}
		if msg.Type != zmq4.CmdMsg {
			return msg.Frames, nil
		}
	}
}

// bufConn is a connection whose reads go through a buffer. zmq4 reads
// every ZMTP frame with separate reads (a header, then its body): three
// frames a message; through the buffer one system call returns every
// frame that has arrived (TestBufConnReadsOnce). Read from one goroutine
// at a time.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func newBufConn(c net.Conn) *bufConn { return &bufConn{Conn: c, r: bufio.NewReaderSize(c, readBuffer)} }

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }
