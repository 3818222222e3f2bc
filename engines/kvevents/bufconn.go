package kvevents

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// zmq4 reads every ZMTP frame with separate read calls on the connection
// (a header, then its body): three frames a message, about six system calls
// a batch, a quarter of the CPU BenchmarkIngest spent. A dialed tcp://
// endpoint goes through bufferedScheme instead, whose connections read
// through a buffer: one system call returns every frame that has arrived.

// bufferedScheme is the zmq4 transport dialing TCP with buffered reads.
const bufferedScheme = "omnious-kv-tcp"

// readBuffer is each connection's read buffer: several batches of 16
// blocks (about 1.5 KB each); a larger frame is read straight into its
// body. 1,024 engines hold 8 MiB of buffers.
const readBuffer = 8 << 10

var registerBuffered sync.Once

type bufferedTransport struct{}

func (bufferedTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return newBufConn(c), nil
}

func (bufferedTransport) Listen(context.Context, string) (net.Listener, error) {
	return nil, fmt.Errorf("the %s transport only dials", bufferedScheme)
}

func (bufferedTransport) Addr(ep string) (string, error) { return transport.New("tcp").Addr(ep) }

// bufferedEndpoint returns the endpoint zmq4 dials for a tcp:// endpoint:
// the same address through bufferedScheme. Other schemes are unchanged.
func bufferedEndpoint(endpoint string) string {
	addr, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return endpoint
	}
	registerBuffered.Do(func() { _ = zmq4.RegisterTransport(bufferedScheme, bufferedTransport{}) })
	return bufferedScheme + "://" + addr
}

// bufConn is a connection whose reads go through a buffer. zmq4 reads a
// connection from one goroutine at a time.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func newBufConn(c net.Conn) *bufConn { return &bufConn{Conn: c, r: bufio.NewReaderSize(c, readBuffer)} }

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }
