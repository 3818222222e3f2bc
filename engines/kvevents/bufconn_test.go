package kvevents

import (
	"io"
	"net"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBufferedEndpoint(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"tcp://127.0.0.1:5557", bufferedScheme + "://127.0.0.1:5557"},
		{"tcp://[fd00::1]:5557", bufferedScheme + "://[fd00::1]:5557"},
		{"ipc:///tmp/kv.sock", "ipc:///tmp/kv.sock"},
		{"inproc://kv", "inproc://kv"},
	} {
		require.Equal(t, tc.want, bufferedEndpoint(tc.in), tc.in)
	}
	addr, err := bufferedTransport{}.Addr("127.0.0.1:5557")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:5557", addr)
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
