package scheduler

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/kvindex"
)

// BenchmarkSpeculativeMatchCold matches a 50k-token prompt's keys (3,125
// blocks at block size 16) that the previous request credited, in both
// generations, as a hot prompt's are: the CPU's caches are evicted before
// every match (64 MiB written, outside the timer), as other processes
// leave them between two requests in the EPP.
func BenchmarkSpeculativeMatchCold(b *testing.B) {
	rng := rand.New(rand.NewPCG(5, 6))
	keys := make([]kvindex.Key, 3125)
	for i := range keys {
		keys[i] = kvindex.Key(rng.Uint64() | 1)
	}
	sp := newSpeculative(2 * time.Second)
	now := time.Unix(1000, 0)
	sp.credit(1, keys, now)
	now = now.Add(3 * time.Second / 2)
	sp.credit(1, keys, now) // the second generation: a copy of the first
	evict := make([]byte, 64<<20)
	var out []prefixHit
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		for i := 0; i < len(evict); i += 64 {
			evict[i]++
		}
		b.StartTimer()
		out = sp.match(keys, now, out[:0])
	}
	require.Equal(b, []prefixHit{{r: 1, n: len(keys)}}, out)
}
