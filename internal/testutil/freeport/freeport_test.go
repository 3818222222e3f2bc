package freeport

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTake(t *testing.T) {
	eph, err := ephemeralLow()
	require.NoError(t, err)
	lo, hi := window()
	require.Equal(t, eph, hi, "the window ends where the ephemeral range begins")
	require.GreaterOrEqual(t, lo, minPort)
	seen := map[int]bool{}
	for range 20 {
		ports, err := Take(3)
		require.NoError(t, err)
		require.Len(t, ports, 3)
		for _, p := range ports {
			require.False(t, seen[p], "port %d handed out twice", p)
			seen[p] = true
			require.True(t, p >= lo && p < hi, "port %d outside [%d, %d)", p, lo, hi)
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			require.NoError(t, err, "a taken port is free again")
			require.NoError(t, l.Close())
		}
	}
}

// TestTakeOneWindow draws from a window of one port: busy, it has none to
// give; free, it gives it once and never again.
func TestTakeOneWindow(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := busy.Addr().(*net.TCPAddr).Port
	_, err = take(1, p, p+1)
	require.ErrorContains(t, err, "no free loopback port")
	require.NoError(t, busy.Close())
	got, err := take(1, p, p+1)
	require.NoError(t, err)
	require.Equal(t, []int{p}, got)
	_, err = take(1, p, p+1)
	require.ErrorContains(t, err, "no free loopback port", "never the same port twice")
}

// TestTakeKernel leaves the choice to the kernel where the window is empty.
func TestTakeKernel(t *testing.T) {
	ports, err := take(2, 0, 0)
	require.NoError(t, err)
	require.Len(t, ports, 2)
	require.NotEqual(t, ports[0], ports[1])
}
