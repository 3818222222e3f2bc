// Package freeport picks loopback TCP ports for the servers the bench and
// the tests start as child processes, which must be told their ports before
// they bind them.
//
// A port the kernel hands out for "127.0.0.1:0" comes from its ephemeral
// range, the same range it draws from for every outgoing connection; a
// harness holding thousands of connections open can take such a port in
// the moment between its choice and the child's bind, and the child then
// fails with "address already in use". Ports are therefore drawn from
// below the ephemeral range, where only an explicit bind can land, checked
// free by binding them, and never handed out twice by one process.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// rangeFile is where Linux states its ephemeral port range.
const rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// span is how many ports below the ephemeral range are drawn from; below
// minPort are the well-known and commonly configured ones.
const (
	span    = 16384
	minPort = 10000
)

var (
	mu     sync.Mutex
	handed = map[int]bool{} // every port this process handed out
)

// Take returns n distinct TCP ports on 127.0.0.1 that were free a moment
// ago and below the kernel's ephemeral range (or chosen by the kernel where
// that range leaves no room below it).
func Take(n int) ([]int, error) {
	lo, hi := window()
	return take(n, lo, hi)
}

// take is Take drawing from [lo, hi).
func take(n, lo, hi int) ([]int, error) {
	mu.Lock()
	defer mu.Unlock()
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			_ = l.Close()
		}
	}()
	ports := make([]int, 0, n)
	start := 0
	if hi > lo {
		start = rand.IntN(hi - lo)
	}
	for i := 0; len(ports) < n; i++ {
		var p int
		if hi > lo {
			if i >= hi-lo {
				return nil, fmt.Errorf("no free loopback port in %d-%d", lo, hi-1)
			}
			p = lo + (start+i)%(hi-lo)
			if handed[p] {
				continue
			}
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			if p == 0 {
				return nil, fmt.Errorf("cannot reserve a loopback port: %w", err)
			}
			continue
		}
		lns = append(lns, l)
		p = l.Addr().(*net.TCPAddr).Port
		if handed[p] {
			continue // the kernel's own choice, already given out
		}
		handed[p] = true
		ports = append(ports, p)
	}
	return ports, nil
}

// window is the range [lo, hi) Take draws from; lo == hi leaves the choice
// to the kernel.
func window() (lo, hi int) {
	eph, err := ephemeralLow()
	if err != nil || eph-minPort < 1024 {
		return 0, 0
	}
	return max(minPort, eph-span), eph
}

// ephemeralLow is the first port of the kernel's ephemeral range.
func ephemeralLow() (int, error) {
	raw, err := os.ReadFile(rangeFile)
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(raw))
	if len(f) != 2 {
		return 0, errors.New("freeport: unexpected " + rangeFile)
	}
	return strconv.Atoi(f[0])
}
