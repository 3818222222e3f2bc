// Package leak checks, in the bench's tests, that what a test started is
// gone afterwards: its goroutines and its listening ports.
package leak

import (
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Goroutines is the number of live goroutines, with their stacks.
// Goroutines of go-zeromq/zmq4's PUB writer are not counted: zmq4 v0.17
// never stops them (pubSocket.Close does not close its pubMWriter), which is
// a library leak outside the bench's control.
func Goroutines() (int, string) {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	var kept []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "zmq4.(*pubMWriter).run") {
			continue
		}
		n++
		kept = append(kept, g)
	}
	return n, strings.Join(kept, "\n\n")
}

// Settle waits until the goroutine count (Goroutines) is back to at most
// base, and fails the test with the stacks left if it is not within 10s.
func Settle(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	n, stacks := Goroutines()
	for n > base && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		n, stacks = Goroutines()
	}
	if n > base {
		t.Fatalf("%d goroutines left running (baseline %d):\n%s", n, base, stacks)
	}
}

// RequireFree fails the test unless hostport can be listened on again.
func RequireFree(t *testing.T, hostport string) {
	t.Helper()
	l, err := net.Listen("tcp", hostport)
	require.NoError(t, err, "port %s still bound", hostport)
	require.NoError(t, l.Close())
}
