package label

import (
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSet(t *testing.T) {
	s := NewSet(3, "other")
	for _, tt := range []struct {
		v, label string
	}{{"a", "a"}, {"b", "b"}, {"a", "a"}, {"c", "c"}, {"d", "other"}, {"b", "b"}, {"e", "other"}} {
		require.Equal(t, tt.label, s.Label(tt.v), tt.v)
	}
	require.Equal(t, 3, s.Len())
	require.Equal(t, "a", s.Known("a"))
	require.Equal(t, "other", s.Known("d"))

	k := NewSet(2, "unknown")
	require.Equal(t, "unknown", k.Known("x"), "Known never adds")
	require.Zero(t, k.Len())
	_, added := k.Add("x")
	require.True(t, added)
	_, added = k.Add("x")
	require.False(t, added, "added once")

	zero := NewSet(0, "other")
	require.Equal(t, "other", zero.Label("a"), "0 admits nothing")
	require.Zero(t, zero.Len())
}

// TestSetConcurrent: many goroutines adding distinct and shared values
// never overshoot the bound, and each value is reported added once.
func TestSetConcurrent(t *testing.T) {
	const max = 100
	s := NewSet(max, "other")
	var wg sync.WaitGroup
	var mu sync.Mutex
	added := map[string]int{}
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10_000 {
				v := strconv.Itoa(i % 500)
				if g%2 == 0 {
					v = strconv.Itoa(g*1_000_000 + i)
				}
				if _, a := s.Add(v); a {
					mu.Lock()
					added[v]++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	require.Equal(t, max, s.Len())
	require.Len(t, added, max)
	for v, n := range added {
		require.Equal(t, 1, n, v)
	}
}
